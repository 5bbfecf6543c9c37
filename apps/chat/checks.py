"""System checks: a registry that cannot be read, or a router that cannot be imported,
stops ``manage.py`` commands (migrate, runserver, check) with the field at fault, instead
of failing the first answer."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from apps.chat.services.registry import model_registry


@register("inference")
def model_registry_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        model_registry()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), hint="See config/settings/inference.py.", id="chat.E001")]
    return []


@register("inference")
def router_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``ROUTER`` names something importable (made only when ``auto`` first routes: a
    router may load a model of its own)."""
    try:
        import_string(settings.ROUTER)
    except ImportError as exc:
        hint = "A dotted path such as apps.chat.services.routers.PromptLengthRouter."
        return [
            Error(f"ROUTER: cannot import {settings.ROUTER!r}: {exc}", hint=hint, id="chat.E002")
        ]
    return []


HISTORY_POLICIES = ("drop", "summarize")


@register("inference")
def history_policy_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if settings.HISTORY_POLICY in HISTORY_POLICIES:
        return []
    return [
        Error(
            f"HISTORY_POLICY is {settings.HISTORY_POLICY!r}; use one of {HISTORY_POLICIES}.",
            hint="See config/settings/inference.py.",
            id="chat.E003",
        )
    ]
