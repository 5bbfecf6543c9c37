"""What ``POST /v1/chat/completions`` accepts for tools: the definitions (``tools``), the
choice among them (``tool_choice``), and the calls an assistant turn made, sent back in a
tool loop; bounded before anything is counted, since every definition is counted into
every prompt.
"""

from __future__ import annotations

import json
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.exceptions import InvalidRequest
from inference import Tools

MAX_TOOLS = 128
"""OpenAI's own cap on ``tools``."""
MAX_TOOLS_CHARS = 256 * 1024
"""The most characters ``tools`` may take as JSON: each definition is counted into every
prompt, so a cap well under the body's keeps the count bounded before it runs."""
TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
"""A function's name, as OpenAI constrains it."""


class FunctionCallInput(serializers.Serializer[dict[str, Any]]):
    name = serializers.RegexField(TOOL_NAME)
    arguments = serializers.CharField(allow_blank=True, trim_whitespace=False)


class ToolCallInput(serializers.Serializer[dict[str, Any]]):
    """A call an earlier assistant turn made, sent back in a tool loop."""

    id = serializers.CharField(max_length=256)
    type = serializers.ChoiceField(choices=["function"])
    function = FunctionCallInput()


class FunctionInput(serializers.Serializer[dict[str, Any]]):
    name = serializers.RegexField(TOOL_NAME)
    description = serializers.CharField(required=False, allow_blank=True)
    parameters = serializers.DictField(required=False, help_text="a JSON Schema object")
    strict = serializers.BooleanField(required=False, allow_null=True)


class ToolInput(serializers.Serializer[dict[str, Any]]):
    type = serializers.ChoiceField(choices=["function"])
    function = FunctionInput()


class ToolListInput(serializers.ListSerializer[dict[str, Any]]):
    """``tools``: at most :data:`MAX_TOOLS`, :data:`MAX_TOOLS_CHARS` as JSON, checked
    before any is validated; names unique."""

    def to_internal_value(self, data: Any) -> list[dict[str, Any]]:
        if isinstance(data, list):
            size = len(json.dumps(data))
            if len(data) > MAX_TOOLS or size > MAX_TOOLS_CHARS:
                raise InvalidRequest(
                    f"tools: {len(data)} definitions, {size} characters of JSON; at most "
                    f"{MAX_TOOLS} and {MAX_TOOLS_CHARS} are accepted.",
                    code="too_many_tools",
                    param="tools",
                )
        tools: list[dict[str, Any]] = super().to_internal_value(data)
        names = [tool["function"]["name"] for tool in tools]
        if len(set(names)) != len(names):
            raise InvalidRequest("tools: function names must be unique.", param="tools")
        return tools


class ToolListItemInput(ToolInput):
    class Meta:
        list_serializer_class = ToolListInput


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "enum": ["none", "auto", "required"]},
            {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["function"]},
                    "function": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}},
                        "required": ["name"],
                    },
                },
                "required": ["type", "function"],
            },
        ]
    }
)
class ToolChoiceField(serializers.Field[Any, Any, Any, Any]):
    """``tool_choice``: ``none``, ``auto``, ``required``, or one function named."""

    def to_internal_value(self, data: Any) -> str | dict[str, Any]:
        if data in ("none", "auto", "required"):
            return str(data)
        function = data.get("function") if isinstance(data, dict) else None
        if isinstance(function, dict) and data.get("type") == "function":
            name = function.get("name")
            if isinstance(name, str) and name:
                return {"type": "function", "function": {"name": name}}
        raise serializers.ValidationError(
            'none, auto, required or {"type": "function", "function": {"name": …}}.'
        )

    def to_representation(self, value: Any) -> Any:
        return value


def tools_check(attrs: dict[str, Any]) -> None:
    """``tool_choice`` and ``parallel_tool_calls`` mean nothing without ``tools`` (400, as
    OpenAI answers); a function ``tool_choice`` names is one of them."""
    tools, choice = attrs.get("tools"), attrs.get("tool_choice")
    if not tools:
        for name in ("tool_choice", "parallel_tool_calls"):
            if attrs.get(name) is not None:
                raise InvalidRequest(f"{name} is only allowed when tools are given.", param=name)
        return
    if isinstance(choice, dict):
        named = choice["function"]["name"]
        if named not in {tool["function"]["name"] for tool in tools}:
            raise InvalidRequest(
                f"tool_choice names {named[:64]!r}, which is not among tools.",
                param="tool_choice",
            )


def tools_of(data: dict[str, Any]) -> Tools | None:
    """The request's tools as the tier takes them (unset fields dropped), or None."""
    tools = data.get("tools")
    if not tools:
        return None
    definitions = tuple(
        {
            "type": "function",
            "function": {k: v for k, v in tool["function"].items() if v is not None},
        }
        for tool in tools
    )
    return Tools(
        definitions=definitions,
        choice=data.get("tool_choice"),
        parallel=data.get("parallel_tool_calls"),
    )
