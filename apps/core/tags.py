"""Purpose tags: what a request's tokens were for (a workflow, a project, an experiment),
carried on every ledger row it writes and grouped by in usage reports.

A tag is a short slug: lower-case letters, digits, ``.``, ``_`` and ``-``, starting with a
letter or digit, at most :data:`TAG_MAX_LENGTH` characters. A request names one (``tag`` on
the native API, ``metadata.tag`` on ``/v1``), or its key's default applies (set at
issue). How many distinct tags a team may use is capped in :mod:`apps.usage.tags`."""

from __future__ import annotations

import re

from apps.core.exceptions import InvalidRequest

TAG_MAX_LENGTH = 32
TAG_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")
TAG_HELP = "a purpose tag for the usage: a-z, 0-9, '.', '_', '-', at most 32"


def tag_check(value: object, *, param: str = "tag") -> str:
    """``value`` as a tag, or 400 ``invalid_value`` naming ``param``."""
    if not isinstance(value, str) or not TAG_PATTERN.fullmatch(value):
        raise InvalidRequest(
            f"{param}: {TAG_HELP} (first a letter or digit).", code="invalid_value", param=param
        )
    return value
