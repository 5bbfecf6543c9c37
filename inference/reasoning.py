"""Split ``<think>…</think>`` spans out of streamed content.

Servers without a reasoning parser (llama.cpp, vLLM without ``--reasoning-parser``) send a
reasoning model's thoughts inline, tags included, and a tag may arrive split across
chunks. The splitter holds back only the few characters that could be the start of a tag.

Reasoning comes first or not at all, as every reasoning model emits it: ``<think>`` opens a
block only at the start of the output (after whitespace); once the answer has begun, a
``<think>`` is text the model wrote, and the rest of the answer is never hidden. Templates
that open the block in the prompt (DeepSeek-R1's) start the output inside it
(``opened=True``), so the lone ``</think>`` that ends it keeps the thoughts out of the
answer; a lone ``</think>`` anywhere else is dropped rather than shown.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["content", "reasoning"]
OPEN, CLOSE = "<think>", "</think>"


class ThinkSplitter:
    def __init__(self, *, opened: bool = False) -> None:
        self._buffer = ""
        self._inside = opened
        self._answering = False
        """The answer has begun: no block can open any more."""

    def feed(self, text: str) -> list[tuple[Kind, str]]:
        if text and not self._buffer and "<" not in text and (self._inside or self._answering):
            # Nearly every token: nothing held, and no tag can start in it.
            return [("reasoning" if self._inside else "content", text)]
        self._buffer += text
        out: list[tuple[Kind, str]] = []
        while self._buffer:
            if self._inside:
                at = self._buffer.find(CLOSE)
                if at < 0:
                    return self._hold(out, CLOSE)
                self._emit(out, self._buffer[:at])
                self._buffer = self._buffer[at + len(CLOSE) :]
                self._inside = False
            elif not self._answering:
                start = self._buffer.lstrip()
                if start.startswith(OPEN):
                    self._buffer = start[len(OPEN) :]
                    self._inside = True
                elif not start or OPEN.startswith(start):
                    return out  # whitespace, or what may be the start of the tag: wait
                else:
                    self._answering = True
            else:
                at = self._buffer.find(CLOSE)
                if at < 0:
                    return self._hold(out, CLOSE)
                self._emit(out, self._buffer[:at])  # a stray closing tag is not text
                self._buffer = self._buffer[at + len(CLOSE) :]
        return out

    def flush(self) -> list[tuple[Kind, str]]:
        out: list[tuple[Kind, str]] = []
        self._emit(out, self._buffer)
        self._buffer = ""
        return out

    def _hold(self, out: list[tuple[Kind, str]], tag: str) -> list[tuple[Kind, str]]:
        """Emit all but a suffix that may be the start of ``tag``."""
        keep = _partial_suffix(self._buffer, tag)
        self._emit(out, self._buffer[: len(self._buffer) - keep])
        self._buffer = self._buffer[len(self._buffer) - keep :]
        return out

    def _emit(self, out: list[tuple[Kind, str]], text: str) -> None:
        if text:
            out.append(("reasoning" if self._inside else "content", text))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    if tag[0] not in text[1 - len(tag) :]:
        return 0  # every such suffix starts with the tag's first character
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
