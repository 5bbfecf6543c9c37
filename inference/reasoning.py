"""Split ``<think>…</think>`` spans out of streamed content.

Servers without a reasoning parser (llama.cpp, vLLM without ``--reasoning-parser``) send a
reasoning model's thoughts inline, tags included, and a tag may arrive split across
chunks. The splitter holds back only the few characters that could be the start of a tag.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["content", "reasoning"]
OPEN, CLOSE = "<think>", "</think>"


class ThinkSplitter:
    def __init__(self) -> None:
        self._buffer = ""
        self._inside = False

    def feed(self, text: str) -> list[tuple[Kind, str]]:
        self._buffer += text
        out: list[tuple[Kind, str]] = []
        while True:
            tag = CLOSE if self._inside else OPEN
            at = self._buffer.find(tag)
            if at >= 0:
                self._emit(out, self._buffer[:at])
                self._buffer = self._buffer[at + len(tag) :]
                self._inside = not self._inside
                continue
            keep = _partial_suffix(self._buffer, tag)
            self._emit(out, self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return out

    def flush(self) -> list[tuple[Kind, str]]:
        out: list[tuple[Kind, str]] = []
        self._emit(out, self._buffer)
        self._buffer = ""
        return out

    def _emit(self, out: list[tuple[Kind, str]], text: str) -> None:
        if text:
            out.append(("reasoning" if self._inside else "content", text))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
