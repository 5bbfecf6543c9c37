"""System checks: a registry that cannot be read stops ``manage.py`` commands (migrate,
runserver, check) with the field at fault, instead of failing the first answer."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, register
from django.core.exceptions import ImproperlyConfigured

from apps.chat.services.registry import model_registry


@register("inference")
def model_registry_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        model_registry()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), hint="See config/settings/inference.py.", id="chat.E001")]
    return []


HISTORY_POLICIES = ("drop", "summarize")


@register("inference")
def history_policy_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from django.conf import settings

    if settings.HISTORY_POLICY in HISTORY_POLICIES:
        return []
    return [
        Error(
            f"HISTORY_POLICY is {settings.HISTORY_POLICY!r}; use one of {HISTORY_POLICIES}.",
            hint="See config/settings/inference.py.",
            id="chat.E002",
        )
    ]
