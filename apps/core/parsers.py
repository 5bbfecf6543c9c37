"""JSON request bodies with a nesting limit.

``json.loads`` recurses once per level: a body of 100,000 ``[`` raises ``RecursionError``,
which DRF's parser (it catches ``ValueError``) lets through as a 500. And a body nested a
few hundred levels parses, then takes the stack to its limit in whatever walks it next
(validation, ``json.dumps`` into the database). No request of this API nests deeper than a
handful of levels, so past ``MAX_JSON_DEPTH`` a body is refused as ``400 invalid_json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError
from rest_framework.utils.json import strict_constant

MAX_JSON_DEPTH = 64


class JsonTooDeep(ValueError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"nested deeper than {limit} levels")


def json_loads(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH, strict: bool = True) -> Any:
    """``json.loads`` that raises ``JsonTooDeep`` (a ``ValueError``, like every other
    malformed input) for nesting deeper than ``max_depth``; ``strict`` refuses NaN and
    Infinity, as DRF does."""
    try:
        value = json.loads(text, parse_constant=strict_constant if strict else None)
    except RecursionError:
        raise JsonTooDeep(max_depth) from None
    # Each level opens with a bracket, so their count bounds the depth: most bodies are
    # done here, without walking the value.
    if isinstance(text, bytes):
        brackets = text.count(b"[") + text.count(b"{")
    else:
        brackets = text.count("[") + text.count("{")
    if brackets > max_depth and _deeper_than(value, max_depth):
        raise JsonTooDeep(max_depth)
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` arrays and objects; level by level, so
    no recursion, and only containers are kept."""
    level = [value] if isinstance(value, dict | list) else []
    for _ in range(limit):
        children: list[Any] = []
        for item in level:
            members = item.values() if isinstance(item, dict) else item
            children.extend(child for child in members if isinstance(child, dict | list))
        if not children:
            return False
        level = children
    return True


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser with :func:`json_loads`: too deep is a ``ParseError`` (400)."""

    def parse(
        self,
        stream: IO[bytes],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        encoding = parsers.get_encoding(parser_context or {})  # type: ignore[attr-defined]
        try:
            return json_loads(stream.read().decode(encoding), strict=self.strict)
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
