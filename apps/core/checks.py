"""System checks: Django's deploy checks made to see this project's middleware, and the
monitoring access settings.

Django finds its security, CSRF and clickjacking middleware by their dotted paths in
``MIDDLEWARE``; this project lists subclasses that run on the event loop
(``apps.core.middleware``), so Django would report them missing (W001, W002, W003, which
the settings silence) and skip every check that depends on them (HSTS, SSL redirect,
nosniff, X-Frame-Options, secure CSRF cookie). ``stock_middleware_checks`` reports a
missing one itself and runs those checks as if the stock paths were listed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.checks.security import base, csrf
from django.utils.module_loading import import_string

STOCK_MIDDLEWARE = {
    "django.middleware.security.SecurityMiddleware": "security.W001",
    "django.middleware.csrf.CsrfViewMiddleware": "security.W003",
    "django.middleware.clickjacking.XFrameOptionsMiddleware": "security.W002",
}

# Django's deploy checks that pass silently when they do not find the stock middleware.
MIDDLEWARE_DEPENDENT: tuple[Callable[..., list[checks.CheckMessage]], ...] = (
    base.check_sts,
    base.check_sts_include_subdomains,
    base.check_sts_preload,
    base.check_content_type_nosniff,
    base.check_ssl_redirect,
    base.check_xframe_deny,
    base.check_referrer_policy,
    base.check_cross_origin_opener_policy,
    csrf.check_csrf_cookie_secure,
)


def _as_stock(path: str) -> str:
    """The stock middleware path that ``path`` is (or subclasses), else ``path`` itself."""
    try:
        middleware = import_string(path)
    except ImportError:
        return path
    for stock in STOCK_MIDDLEWARE:
        if isinstance(middleware, type) and issubclass(middleware, import_string(stock)):
            return stock
    return path


@checks.register(checks.Tags.security, deploy=True)
def stock_middleware_checks(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[checks.CheckMessage]:
    mapped = [_as_stock(path) for path in settings.MIDDLEWARE]
    messages: list[checks.CheckMessage] = [
        checks.Warning(
            f"MIDDLEWARE has neither {stock} nor a subclass of it.",
            id=f"ragtier.{django_id}",
        )
        for stock, django_id in STOCK_MIDDLEWARE.items()
        if stock not in mapped
    ]
    from django.test.utils import override_settings  # only when the deploy checks run

    with override_settings(MIDDLEWARE=mapped):
        for check in MIDDLEWARE_DEPENDENT:
            messages.extend(check(app_configs=app_configs))
    return messages


@checks.register(checks.Tags.security)
def monitoring_networks_check(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Every ``METRICS_ALLOWED_NETWORKS`` entry is a network (a typo would lock out, or
    let in, more than meant)."""
    errors: list[checks.CheckMessage] = []
    for network in settings.METRICS_ALLOWED_NETWORKS:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            errors.append(
                checks.Error(
                    f"METRICS_ALLOWED_NETWORKS: {network!r} is not a network (CIDR).",
                    id="ragtier.E010",
                )
            )
    return errors
