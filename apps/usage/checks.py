"""System checks: an ``ENERGY_SOURCE`` that names no source stops ``manage.py`` commands
(migrate, runserver, check) instead of failing the first answer. Whether the counter can
be read is found at the first answer (the table when not: docs/energy.md)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register

from inference.energy import SOURCES


@register("usage")
def energy_source_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    source = settings.ENERGY_SOURCE
    if source in SOURCES:
        return []
    message = f"ENERGY_SOURCE is {source!r}: it must be one of {', '.join(SOURCES)}."
    return [Error(message, hint="See docs/energy.md.", id="usage.E001")]
