"""vLLM's tokenizer: a Hugging Face tokenizer folder and its chat template, offline, fed
messages and tools as vLLM feeds them to the template (its request models normalize both)."""

from __future__ import annotations

import contextlib
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


def _as_vllm_reads(message: ChatMessage) -> dict[str, Any]:
    """A message as vLLM hands it to the template: a call's ``arguments`` decoded from
    their JSON text (Hugging Face's tool templates expect an object; {} for none)."""
    calls = message.get("tool_calls")
    if not calls:
        return dict(message)
    decoded = []
    for call in calls:
        function = dict(call.get("function") or {})
        arguments = function.get("arguments")
        # Not JSON: vLLM refuses the request, so there is no count to match.
        with contextlib.suppress(TypeError, ValueError):
            function["arguments"] = json.loads(arguments) if arguments else {}
        decoded.append({**call, "function": function})
    return {**message, "tool_calls": decoded}


def _tool_as_vllm_reads(tool: ToolDefinition) -> dict[str, Any]:
    """A tool as vLLM's request model dumps it for the template: the function's name,
    description and parameters (null when absent), ``strict`` only when given, and
    nothing else."""
    function = tool.get("function") or {}
    dumped = {name: function.get(name) for name in ("name", "description", "parameters")}
    if function.get("strict") is not None:
        dumped["strict"] = function["strict"]
    return {"type": tool.get("type", "function"), "function": dumped}


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
            [_as_vllm_reads(m) for m in escaped_messages(messages, self.escape)],
            tools=[_tool_as_vllm_reads(t) for t in tools] or None,
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
