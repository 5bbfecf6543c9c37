"""Text as the keyword index reads it, and a query as BM25 scores it.

Text is analysed much as Lucene's ``EnglishAnalyzer`` does it, fixed on principle rather
than tuned: lower case, words of two or more letters or digits, Lucene's 33 English stop
words removed, Snowball English (Porter 2) stems. ``XQ-7781-B`` is found by ``xq`` and
``7781``.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import bm25s
import Stemmer

# bm25s sets its own logger to DEBUG at import, which would log every index build.
logging.getLogger("bm25s").setLevel(logging.WARNING)

LANGUAGE = "english"


@functools.cache
def stemmer() -> Any:
    """Snowball's English stemmer, made once per process."""
    return Stemmer.Stemmer(LANGUAGE)


def keyword_tokens(texts: Sequence[str]) -> list[list[str]]:
    """Each text as the index sees it: lower-cased, stop words out, stemmed."""
    if not texts:
        return []
    tokens: list[list[str]] = bm25s.tokenize(
        list(texts),
        stopwords=LANGUAGE,
        stemmer=stemmer(),
        return_ids=False,
        show_progress=False,
    )
    return tokens


@dataclass(frozen=True)
class KeywordQuery:
    """A query as BM25 scores it: each distinct term once, with how often it occurs."""

    terms: tuple[str, ...]
    counts: tuple[int, ...]


def keyword_query(text: str, *, max_terms: int | None = None) -> KeywordQuery:
    """``text``'s distinct terms in order of first use, each with its count, the first
    ``max_terms`` only (None: all).

    A query's scoring work is one pass over the postings of each distinct term, so a
    question pasted at many times the context window (or one word repeated) costs at most
    ``max_terms`` passes. A term used n times still weighs n times, as bm25s sums each
    occurrence: within the cap, scores are unchanged (past it, a term's uses are counted
    in the text read until the cap was reached).
    """
    counts: Counter[str] = Counter()  # insertion order: first use
    for piece in _pieces(text, QUERY_SLICE_CHARS):
        counts.update(keyword_tokens([piece])[0])
        if max_terms is not None and len(counts) >= max_terms:
            break  # the rest of a long text is not even tokenized
    kept = list(counts.items())[:max_terms] if max_terms is not None else list(counts.items())
    return KeywordQuery(tuple(term for term, _ in kept), tuple(count for _, count in kept))


QUERY_SLICE_CHARS = 8192
"""A query is tokenized a slice at a time, until it has its distinct terms: tokenizing a
question pasted at many times the context window whole would cost more than searching."""


def _pieces(text: str, size: int) -> Iterator[str]:
    """``text`` in slices of about ``size`` characters, each cut at whitespace (a word is
    never split), the last one whatever remains."""
    start = 0
    while start < len(text):
        end = start + size
        if end < len(text):
            cut = text.rfind(" ", start, end)
            end = cut if cut > start else end
        yield text[start:end]
        start = end
