"""vLLM's tokenizer: a Hugging Face tokenizer folder and its chat template, offline."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inference.errors import TokenizerUnavailable
from inference.tokenizers.base import (
    ChatMessage,
    ToolDefinition,
    escape_control_tokens,
    escaped_messages,
    special_tokens_pattern,
)


class HFTokenizer:
    """A Hugging Face tokenizer folder (``tokenizer.json`` + chat template), offline."""

    def __init__(self, *, path: str | Path) -> None:
        from transformers import AutoTokenizer

        if not Path(path).is_dir():
            raise TokenizerUnavailable(f"tokenizer folder {path} does not exist")
        self._tokenizer: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.name = Path(path).name
        # Added tokens are matched in text whatever their flag; the special ones are the
        # template's markers (a non-special added token may be plain whitespace).
        added = self._tokenizer.added_tokens_decoder.values()
        self._specials = special_tokens_pattern(
            [*self._tokenizer.all_special_tokens, *(t.content for t in added if t.special)]
        )

    def escape(self, text: str) -> str:
        return escape_control_tokens(text, self._specials) if self._specials else text

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer(
            self.escape(text), add_special_tokens=False, split_special_tokens=True
        )["input_ids"]
        return ids

    def encode_chat(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolDefinition] = ()
    ) -> list[int]:
        ids = self._tokenizer.apply_chat_template(
            vllm_messages(escaped_messages(messages, self.escape)),
            tools=vllm_tools(tools) or None,
            add_generation_prompt=True,
            tokenize=True,
        )
        # A BatchEncoding (a Mapping, not a dict) in recent transformers, a list before.
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def count_chat(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolDefinition] = ()
    ) -> int:
        return len(self.encode_chat(messages, tools=tools))


# What vLLM hands the chat template is not the request's JSON: the template sees the
# request as vLLM parsed it (vllm/renderers/chat_utils.py and the pydantic models of
# vllm/entrypoints, 0.32), and a template that writes ``tojson`` counts every difference.


def vllm_tools(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """``tools`` as vLLM passes them to the template: ``{"type", "function": {"name",
    "description", "parameters"}}`` in that order, a missing description or parameters as
    None, ``strict`` and ``defer_loading`` only when set, any other key dropped."""
    found: list[dict[str, Any]] = []
    for tool in tools:
        function = tool.get("function")
        if not isinstance(function, Mapping):
            found.append(dict(tool))
            continue
        rendered: dict[str, Any] = {
            "name": function.get("name"),
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        # vLLM copies a tool's defer_loading onto its function when the function has none.
        deferred = function.get("defer_loading", tool.get("defer_loading"))
        for key, value in (("strict", function.get("strict")), ("defer_loading", deferred)):
            if value is not None:
                rendered[key] = value
        entry: dict[str, Any] = {"type": tool.get("type", "function"), "function": rendered}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        found.append(entry)
    return found


def vllm_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """``messages`` as vLLM passes them to the template: an assistant's tool call
    ``arguments`` parsed from their JSON string into an object (anything that is not a
    JSON object, an empty string or none becoming ``{}``), an empty ``tool_calls`` list
    dropped. Templates write those arguments with ``tojson``: the client's string, with
    its own spacing, is never what the model sees."""
    found: list[dict[str, Any]] = []
    for message in messages:
        rendered: dict[str, Any] = dict(message)
        calls = rendered.get("tool_calls")
        if rendered["role"] == "assistant" and isinstance(calls, list):
            if not calls:
                del rendered["tool_calls"]
            else:
                rendered["tool_calls"] = [_parsed_call(call) for call in calls]
        found.append(rendered)
    return found


def _parsed_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping):
        return call  # vLLM refuses the request; the count does not matter
    arguments = function.get("arguments")
    if isinstance(arguments, str) and arguments:
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = None
    return {
        **call,
        "function": {**function, "arguments": arguments if isinstance(arguments, dict) else {}},
    }
