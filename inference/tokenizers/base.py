"""What every tokenizer here offers, and the escaping they share.

A tier renders the template and tokenizes the whole prompt with special tokens parsed, so
``<|im_start|>system`` inside a question or a document would reach the model as a real
role marker. Every tokenizer therefore has :meth:`Tokenizer.escape`: each string its
vocabulary reads as a special token gets a word joiner (U+2060) after its first
character, which leaves it visible but ordinary text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NotRequired, Protocol, TypedDict, runtime_checkable


class ChatMessage(TypedDict):
    role: str
    content: str
    tool_calls: NotRequired[list[dict[str, Any]]]
    """An assistant turn's function calls, in OpenAI's shape (its ``content`` may be "")."""
    tool_call_id: NotRequired[str]
    """A ``tool`` turn: the call it answers."""


ToolDefinition = Mapping[str, Any]
"""One of OpenAI's ``tools``: ``{"type": "function", "function": {"name", "description"?,
"parameters"?}}``, rendered by the chat template as the tier renders it."""


@runtime_checkable
class Tokenizer(Protocol):
    name: str

    def escape(self, text: str) -> str:
        """``text`` as plain text for this vocabulary: every special-token string in it is
        broken by a word joiner, so no tier parses it as one. Idempotent."""

    def count(self, text: str) -> int:
        """Tokens of ``text`` alone, as plain text: no template, no BOS, no special token."""

    def count_chat(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolDefinition] = ()
    ) -> int:
        """Tokens of the prompt the model sees for ``messages``, generation prompt included:
        the template's role markers are special tokens, the contents plain text (escaped
        as :meth:`escape` does, as :func:`inference.assemble_prompt` sends them), and
        ``tools`` as the template renders them (a template that ignores them: none)."""


WORD_JOINER = "\u2060"

# The control tokens of the common chat-template families, for a tokenizer whose
# vocabulary is not at hand (the tier's /tokenize): ChatML, Llama 3, Phi and Harmony
# (<|im_start|>, <|eot_id|>, <|end|>), DeepSeek (the same with fullwidth bars), Llama 2
# and Mistral (<s>, [INST], <<SYS>>, [SYSTEM_PROMPT]), Gemma (<start_of_turn>), <unk>.
CONTROL_TOKENS = re.compile(
    r"<\|[^\s<>|]{1,64}\|>"
    r"|<\uff5c[^\s<>\uff5c]{1,64}\uff5c>"
    r"|</?s>|<unk>|<pad>|<bos>|<eos>|<(?:start|end)_of_turn>|<</?SYS>>"
    r"|\[/?(?:INST|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_RESULTS|TOOL_CALLS)\]"
)


def _break(match: re.Match[str]) -> str:
    token = match.group()
    return token[0] + WORD_JOINER + token[1:]


def escape_control_tokens(text: str, pattern: re.Pattern[str] = CONTROL_TOKENS) -> str:
    """``text`` with every match of ``pattern`` broken by a word joiner after its first
    character: still readable, no longer a special token to any tokenizer."""
    return pattern.sub(_break, text)


def special_tokens_pattern(tokens: Iterable[str]) -> re.Pattern[str] | None:
    """A pattern matching any of ``tokens`` (longest first); None when there are none.
    One-character tokens cannot be broken and are left out."""
    found = sorted({t for t in tokens if len(t) > 1}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, found))) if found else None


def escaped_messages(
    messages: Sequence[ChatMessage], escape: Callable[[str], str]
) -> list[ChatMessage]:
    """``messages`` with their contents escaped; tool calls and tool call ids kept as they
    are (they are JSON the template writes, not text a caller could forge a turn with)."""
    return [{**m, "content": escape(m["content"])} for m in messages]
