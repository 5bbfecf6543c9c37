"""Token-aware chunking that follows the document's own structure.

Chunks are measured with the embedding model's tokenizer so that none is silently
truncated by the model (MiniLM reads 256 word pieces at most). A chunk never crosses a
heading boundary, prefers to break between paragraphs, falls back to sentences and then
to word windows, and repeats a little of the previous chunk so that a fact straddling a
break is still found. Each chunk keeps its title and heading path for citations; they
are also part of the embedded text, because "Installation > Requirements" is context the
paragraph itself does not repeat.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import groupby

from retrieval.errors import DocumentTooLarge
from retrieval.parsing import Block, ParsedDocument

TokenCounter = Callable[[str], int]

MAX_CHARS_PER_TOKEN = 32
"""Text is never counted as fewer tokens than one per this many characters (English runs
at four or five), which bounds a chunk's length in characters as well as in tokens."""

_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+(?=\S)")


@dataclass(frozen=True, slots=True)
class Chunk:
    index: int
    text: str
    title: str
    headings: tuple[str, ...]
    token_count: int
    """Word pieces of :attr:`embedding_text`, without the model's special tokens."""

    @property
    def embedding_text(self) -> str:
        return embedding_text(self.title, self.headings, self.text)


def embedding_text(title: str, headings: tuple[str, ...], text: str) -> str:
    context = " > ".join(part for part in (title, *headings) if part)
    return f"{context}\n{text}" if context else text


@dataclass(frozen=True, slots=True)
class _Unit:
    paragraph: int
    text: str
    tokens: int
    glued: bool = False
    """The unit continues the previous one's word (a piece of an over-long word)."""


def chunk_document(
    document: ParsedDocument,
    *,
    count_tokens: TokenCounter,
    max_tokens: int,
    overlap_tokens: int = 32,
    max_chunks: int | None = None,
) -> list[Chunk]:
    """Split ``document`` into chunks of at most ``max_tokens`` word pieces each."""
    chunks: list[Chunk] = []
    sections = groupby(document.blocks, key=lambda block: block.headings)
    for headings, blocks in sections:
        context = embedding_text(document.title, headings, "")
        budget = max_tokens - count_tokens(context) if context else max_tokens
        if budget < max_tokens // 2:  # an absurd heading path must not starve the text
            headings, budget = headings[-1:], max_tokens // 2
        for text in _pack(
            list(blocks), count_tokens=count_tokens, budget=budget, overlap_tokens=overlap_tokens
        ):
            if max_chunks is not None and len(chunks) >= max_chunks:
                raise DocumentTooLarge(
                    f"the document makes more than {max_chunks} chunks", code="too_many_chunks"
                )
            tokens = count_tokens(embedding_text(document.title, headings, text))
            chunks.append(Chunk(len(chunks), text, document.title, headings, tokens))
    return chunks


def _pack(
    blocks: list[Block], *, count_tokens: TokenCounter, budget: int, overlap_tokens: int
) -> Iterator[str]:
    current: list[_Unit] = []
    used = 0
    fresh = 0  # units in ``current`` not carried over from the previous chunk

    def take_overlap(emitted: list[_Unit]) -> list[_Unit]:
        tail: list[_Unit] = []
        total = 0
        for unit in reversed(emitted[1:]):
            if total + unit.tokens > overlap_tokens:
                break
            tail.insert(0, unit)
            total += unit.tokens
        return tail

    for number, block in enumerate(blocks):
        units = list(_split(block.text, number, count_tokens=count_tokens, budget=budget))
        size = sum(unit.tokens for unit in units)
        # Start a fresh chunk rather than cut a paragraph, when the current one is half full.
        if fresh and used + size > budget and used >= budget // 2:
            yield _join(current)
            current = take_overlap(current)
            used, fresh = sum(u.tokens for u in current), 0
        for unit in units:
            if used + unit.tokens > budget and fresh:
                yield _join(current)
                current = take_overlap(current)
                used, fresh = sum(u.tokens for u in current), 0
            if used + unit.tokens > budget:  # the overlap itself leaves no room
                current, used = [], 0
            current.append(unit)
            used += unit.tokens
            fresh += 1
    if fresh:
        yield _join(current)


def _split(
    text: str, paragraph: int, *, count_tokens: TokenCounter, budget: int
) -> Iterator[_Unit]:
    """A paragraph as one unit if it fits, else as sentences, else as word windows.

    Every character is counted a bounded number of times, so the work is linear in the
    paragraph's length whatever its shape, one long "word" included (docs/abuse.md).
    """
    whole = _cost(text, count_tokens)
    if whole <= budget:
        yield _Unit(paragraph, text, whole)
        return
    for sentence in _SENTENCE_END.split(text):
        # A paragraph of one sentence of one word (a blob) is counted once, not thrice.
        tokens = whole if sentence == text else _cost(sentence, count_tokens)
        if tokens <= budget:
            yield _Unit(paragraph, sentence, tokens)
            continue
        window: list[str] = []
        used = 0
        glued = False  # the window starts with the last piece of a cut word
        for word in sentence.split():
            size = tokens if word == sentence else _cost(word, count_tokens)
            if window and used + size > budget:
                yield _Unit(paragraph, " ".join(window), used, glued)
                window, used, glued = [], 0, False
            if size > budget:  # a single "word" longer than the budget (a base64 blob)
                *pieces, (word, size) = _cut(word, size, count_tokens=count_tokens, budget=budget)
                for number, (piece, cost) in enumerate(pieces):
                    yield _Unit(paragraph, piece, cost, glued=number > 0)
                glued = bool(pieces)
            window.append(word)
            used += size
        if window:
            yield _Unit(paragraph, " ".join(window), used, glued)


def _cost(text: str, count_tokens: TokenCounter) -> int:
    """Tokens, or one per :data:`MAX_CHARS_PER_TOKEN` characters if that is more: a tokenizer
    that reads a 1 MiB word as one ``[UNK]`` must not make a 1 MiB chunk."""
    return max(count_tokens(text), -(-len(text) // MAX_CHARS_PER_TOKEN))


def _cut(word: str, size: int, *, count_tokens: TokenCounter, budget: int) -> list[tuple[str, int]]:
    """``word`` (costing ``size`` > ``budget``) in consecutive pieces of at most ``budget``.

    The piece length is estimated once from the whole word and only shrunk for a piece
    that still costs too much: re-counting the rest of the word after every cut was
    quadratic in its length.
    """
    step = max(1, len(word) * budget // size)
    pieces: list[tuple[str, int]] = []
    start = 0
    while start < len(word):
        piece = word[start : start + step]
        cost = _cost(piece, count_tokens)
        while cost > budget and len(piece) > 1:
            piece = piece[: min(len(piece) - 1, max(1, len(piece) * budget // cost))]
            cost = _cost(piece, count_tokens)
        pieces.append((piece, cost))
        start += len(piece)
    return pieces


def _join(units: list[_Unit]) -> str:
    """Units of one paragraph joined by a space (pieces of one word by nothing), paragraphs
    by a blank line."""
    paragraphs: list[list[str]] = []
    previous = -1
    for unit in units:
        if paragraphs and unit.paragraph == previous and unit.glued:
            paragraphs[-1][-1] += unit.text  # at most a chunk's worth of pieces
        elif paragraphs and unit.paragraph == previous:
            paragraphs[-1].append(unit.text)
        else:
            paragraphs.append([unit.text])
        previous = unit.paragraph
    return "\n\n".join(" ".join(parts) for parts in paragraphs)
