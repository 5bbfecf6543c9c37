"""A deterministic tokenizer for unit tests."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from inference.tokenizers.base import ChatMessage, ToolDefinition, escape_control_tokens

# Like a real vocabulary, the fake reads an unescaped <|name|> as one special token.
_WORD = re.compile(r"<\|\w+\|>|\w+|[^\w\s]", re.UNICODE)


class FakeTokenizer:
    """Words and punctuation are tokens; each message costs 3 more, the prompt 2 more; tool
    definitions and an assistant's tool calls cost the tokens of their JSON."""

    name = "fake-tokenizer"

    def __init__(self, **_: object) -> None:
        pass

    def escape(self, text: str) -> str:
        return escape_control_tokens(text)

    def count(self, text: str) -> int:
        return len(_WORD.findall(self.escape(text)))

    def count_chat(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolDefinition] = ()
    ) -> int:
        calls = [json.dumps(m["tool_calls"]) for m in messages if m.get("tool_calls")]
        structured = sum(self.count(text) for text in calls)
        if tools:
            structured += self.count(json.dumps(list(tools)))
        return sum(3 + self.count(m["content"]) for m in messages) + 2 + structured
