"""BM25 keyword indexes: segments of postings beside the FAISS segments, at the same versions.

Why bm25s (and not tantivy): bm25s analyses text the way Lucene's ``EnglishAnalyzer`` does
in pure Python over numpy, and an index is a folder of ``.npy`` arrays and a JSON
vocabulary (no pickle) that loads in milliseconds and needs no process, lock or commit
protocol of its own, so it is versioned exactly like the FAISS file it sits beside.
tantivy would bring a Rust engine with its own segment files, writer lock and commit
points: a second versioning scheme to keep in step with the vector index's.

Why the scores are computed here and not by bm25s: bm25s precomputes each (chunk, term)
score with the collection's IDF and mean length baked in, so it has no incremental add
and two bm25s indexes cannot be merged: any write rebuilt the whole collection (3.4 s at
10k chunks, 37 s at 100k). A :class:`KeywordIndex` keeps instead the raw postings (term
frequencies and chunk lengths) of the chunks it was built from, and
:class:`KeywordSearcher` scores a query over any set of such segments with the
statistics (chunk count, document frequencies, mean length) of their live chunks taken
together: exactly bm25s's ``lucene`` BM25 (k1 = 1.5, b = 0.75, idf = ln(1 + (N - df +
0.5) / (df + 0.5)), tf / (tf + k1 (1 - b + b dl / avgdl))). So a base plus delta segments
minus tombstones ranks exactly as one index rebuilt from the same chunks (the same sums
of the same terms, bit for bit), and adding a document tokenises only that document.
The price is paid per query: each posting's length normalisation is computed then, not
stored, so a search of 100k synthetic chunks (``bench/keyword_index.py``) takes 3.6 ms p50
against bm25s's 1.2 ms, measured one after the other.

Text is analysed much as Lucene's ``EnglishAnalyzer`` does it, fixed on principle rather
than tuned: lower case, words of two or more letters or digits, Lucene's 33 English stop
words removed, Snowball English (Porter 2) stems. ``XQ-7781-B`` is found by ``xq`` and
``7781``.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
import numpy.typing as npt
import Stemmer

from retrieval.errors import IndexCorrupted
from retrieval.files import folder_write, fsync_directory
from retrieval.hits import Hit

Ids = npt.NDArray[np.int64]

# bm25s sets its own logger to DEBUG at import, which would log every index build.
logging.getLogger("bm25s").setLevel(logging.WARNING)

LANGUAGE = "english"
IDS_FILE = "ids.npy"
VOCABULARY_FILE = "vocabulary.json"
# bm25s's defaults, as in the BM25S paper's BEIR runs.
K1 = 1.5
B = 0.75


@functools.cache
def _stemmer() -> Any:
    return Stemmer.Stemmer(LANGUAGE)


def keyword_tokens(texts: Sequence[str]) -> list[list[str]]:
    """Each text as the index sees it: lower-cased, stop words out, stemmed."""
    if not texts:
        return []
    tokens: list[list[str]] = bm25s.tokenize(
        list(texts),
        stopwords=LANGUAGE,
        stemmer=_stemmer(),
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


class KeywordIndex:
    """The postings of a set of chunks, each known by its chunk id (the same ids as FAISS's).

    Stored by term (compressed sparse columns): the chunks holding term ``t`` are
    ``rows[indptr[t]:indptr[t + 1]]`` (positions in ``ids``), ``tfs`` beside them.
    """

    def __init__(
        self,
        ids: Ids,
        *,
        lengths: npt.NDArray[np.int32] | None = None,
        vocabulary: Sequence[str] = (),
        indptr: npt.NDArray[np.int64] | None = None,
        rows: npt.NDArray[np.int32] | None = None,
        tfs: npt.NDArray[np.int32] | None = None,
    ) -> None:
        self._ids = np.ascontiguousarray(ids, dtype=np.int64)
        count = len(self._ids)
        self.lengths = _array(lengths, np.int32, count)
        self.vocabulary = list(vocabulary)
        self.terms = {term: position for position, term in enumerate(self.vocabulary)}
        self.indptr = _array(indptr, np.int64, len(self.vocabulary) + 1)
        self.rows = _array(rows, np.int32, 0)
        self.tfs = _array(tfs, np.int32, 0)
        if len(self.lengths) != count or len(self.indptr) != len(self.vocabulary) + 1:
            raise IndexCorrupted(
                f"keyword index holds {len(self.lengths)} lengths and "
                f"{len(self.indptr) - 1} terms for {count} ids and {len(self.vocabulary)} words"
            )
        if len(self.rows) != len(self.tfs) or int(self.indptr[-1]) != len(self.rows):
            raise IndexCorrupted("keyword index postings do not match their offsets")

    @classmethod
    def build(cls, ids: Sequence[int] | Ids, texts: Sequence[str]) -> KeywordIndex:
        """Index ``texts[i]`` under ``ids[i]``."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
        if not len(ids):
            return cls(ids)
        # Token ids with their vocabulary straight from the tokenizer: no strings rebuilt.
        tokenized = bm25s.tokenize(
            list(texts), stopwords=LANGUAGE, stemmer=_stemmer(), show_progress=False
        )
        lengths = np.fromiter((len(doc) for doc in tokenized.ids), dtype=np.int32, count=len(ids))
        terms = np.fromiter(
            (term for doc in tokenized.ids for term in doc), dtype=np.int64, count=lengths.sum()
        )
        chunks = np.repeat(np.arange(len(ids), dtype=np.int64), lengths)
        vocabulary = [""] * len(tokenized.vocab)
        for term, position in tokenized.vocab.items():
            vocabulary[position] = term
        return cls._from_pairs(
            ids,
            lengths=lengths,
            vocabulary=vocabulary,
            terms=terms,
            chunks=chunks,
            counts=np.ones_like(terms),
        )

    @classmethod
    def _from_pairs(
        cls,
        ids: Ids,
        *,
        lengths: npt.NDArray[np.int32],
        vocabulary: list[str],
        terms: npt.NDArray[np.int64],
        chunks: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
    ) -> KeywordIndex:
        """Postings from (term, chunk position, count) triples, summing repeated pairs."""
        keys = terms * max(len(ids), 1) + chunks
        unique, inverse = np.unique(keys, return_inverse=True)
        tfs = np.bincount(inverse, weights=counts, minlength=len(unique)).astype(np.int32)
        unique_terms = unique // max(len(ids), 1)
        indptr = np.zeros(len(vocabulary) + 1, dtype=np.int64)
        np.cumsum(np.bincount(unique_terms, minlength=len(vocabulary)), out=indptr[1:])
        rows = (unique % max(len(ids), 1)).astype(np.int32)
        return cls(ids, lengths=lengths, vocabulary=vocabulary, indptr=indptr, rows=rows, tfs=tfs)

    @classmethod
    def merge(cls, parts: Sequence[tuple[KeywordIndex, Ids]]) -> KeywordIndex:
        """One index of the chunks of ``parts`` (index, ids dead in it) that are live: what
        compaction writes as a new base, equal to a build from the same chunks' texts."""
        vocabulary: dict[str, int] = {}
        ids, lengths, terms, chunks, counts = [], [], [], [], []
        offset = 0
        for index, dead in parts:
            alive = ~np.isin(index._ids, dead)
            position = np.cumsum(alive) - 1 + offset  # new position of each live chunk
            local = np.array(
                [vocabulary.setdefault(term, len(vocabulary)) for term in index.vocabulary],
                dtype=np.int64,
            )
            term_of = np.repeat(local, np.diff(index.indptr))
            keep = alive[index.rows]
            terms.append(term_of[keep])
            chunks.append(position[index.rows[keep]])
            counts.append(index.tfs[keep].astype(np.int64))
            ids.append(index._ids[alive])
            lengths.append(index.lengths[alive])
            offset += int(alive.sum())
        if not offset:
            return cls(np.zeros(0, dtype=np.int64))
        return cls._from_pairs(
            np.concatenate(ids),
            lengths=np.concatenate(lengths),
            vocabulary=list(vocabulary),
            terms=np.concatenate(terms),
            chunks=np.concatenate(chunks),
            counts=np.concatenate(counts),
        )

    def __len__(self) -> int:
        return len(self._ids)

    def ids(self) -> Ids:
        return self._ids.copy()

    @functools.cached_property
    def tf_weights(self) -> npt.NDArray[np.float32]:
        """The term frequencies as floats, converted once rather than per query."""
        weights: npt.NDArray[np.float32] = self.tfs.astype(np.float32)
        return weights

    @property
    def nbytes(self) -> int:
        arrays = (self._ids, self.lengths, self.indptr, self.rows, self.tfs)
        return sum(array.nbytes for array in arrays) + 64 * len(self.vocabulary)

    def search(self, query: str | KeywordQuery, k: int, *, allowed: Ids | None = None) -> list[Hit]:
        """The ``k`` best chunks holding at least one of the query's terms, best first.

        ``query``: text, or its terms from :func:`keyword_query` (where a cap applies).
        ``allowed``: only these chunk ids may be returned; the mask applies to every
        chunk's score before the top ``k`` are taken.
        """
        return self._searcher.search(query, k, allowed=allowed)

    @functools.cached_property
    def _searcher(self) -> KeywordSearcher:
        return KeywordSearcher([(self, _NO_IDS)])

    def write(self, path: Path) -> None:
        """Write atomically: a temporary folder beside ``path``, every file fsynced, then
        renamed into place. A folder already at ``path`` is a version whose transaction
        rolled back (versions only move forward under the collection's row lock)."""
        folder_write(path, self.write_into)

    def write_into(self, folder: Path) -> None:
        """Write the arrays into an existing (temporary) folder, fsynced."""
        for name, array in (
            (IDS_FILE, self._ids),
            ("lengths.npy", self.lengths),
            ("indptr.npy", self.indptr),
            ("rows.npy", self.rows),
            ("tfs.npy", self.tfs),
        ):
            np.save(folder / name, array, allow_pickle=False)
        (folder / VOCABULARY_FILE).write_text(json.dumps(self.vocabulary), encoding="utf-8")
        for entry in folder.iterdir():
            with open(entry, "rb") as handle:
                os.fsync(handle.fileno())
        fsync_directory(folder)

    @classmethod
    def read(cls, path: Path) -> KeywordIndex:
        try:
            ids = np.load(path / IDS_FILE, allow_pickle=False)
            if ids.dtype != np.int64 or ids.ndim != 1:
                raise IndexCorrupted(
                    f"keyword index {path} has ids of shape {ids.shape} {ids.dtype}"
                )
            return cls(
                ids,
                lengths=np.load(path / "lengths.npy", allow_pickle=False),
                vocabulary=json.loads((path / VOCABULARY_FILE).read_text(encoding="utf-8")),
                indptr=np.load(path / "indptr.npy", allow_pickle=False),
                rows=np.load(path / "rows.npy", allow_pickle=False),
                tfs=np.load(path / "tfs.npy", allow_pickle=False),
            )
        except (OSError, ValueError, KeyError) as exc:
            raise IndexCorrupted(f"cannot read keyword index {path}: {exc}") from exc


class KeywordSearcher:
    """BM25 over several segments as if they were one index of their live chunks.

    ``parts``: each segment with the chunk ids dead in it (deleted, or replaced by a later
    segment). N, the document frequencies and the mean length count live chunks only, so
    the scores are those of one index built from exactly those chunks.
    """

    def __init__(self, parts: Sequence[tuple[KeywordIndex, Ids]]) -> None:
        alive = [~np.isin(index._ids, dead) if len(dead) else None for index, dead in parts]
        self._count = sum(
            len(index) if a is None else int(a.sum())
            for (index, _), a in zip(parts, alive, strict=True)
        )
        total = sum(
            int(index.lengths.sum() if a is None else index.lengths[a].sum())
            for (index, _), a in zip(parts, alive, strict=True)
        )
        mean_length = total / self._count if total else 1.0
        # Per chunk, the part of BM25's denominator that does not depend on the term.
        self._parts = [
            _Part(index, a, (K1 * ((1 - B) + B * index.lengths / mean_length)).astype(np.float32))
            for (index, _), a in zip(parts, alive, strict=True)
        ]

    def __len__(self) -> int:
        return self._count

    def search(self, query: str | KeywordQuery, k: int, *, allowed: Ids | None = None) -> list[Hit]:
        if not self._count or k <= 0:
            return []
        terms = keyword_query(query) if isinstance(query, str) else query
        scores = [np.zeros(len(part.index), dtype=np.float32) for part in self._parts]
        # Each distinct term is looked up once and weighs as often as the query uses it.
        for token, count in zip(terms.terms, terms.counts, strict=True):
            postings: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]] | None] = []
            frequency = 0
            for part in self._parts:
                found = part.postings(token)
                postings.append(found)
                if found is not None:
                    rows = found[0]
                    frequency += len(rows) if part.alive is None else int(part.alive[rows].sum())
            if not frequency:
                continue
            idf = count * math.log(1 + (self._count - frequency + 0.5) / (frequency + 0.5))
            for part, found, score in zip(self._parts, postings, scores, strict=True):
                if found is not None:
                    rows, tfs = found
                    # Rows are unique within a term: a plain indexed add is exact.
                    score[rows] += idf * tfs / (part.norm[rows] + tfs)
        candidates: list[tuple[Ids, npt.NDArray[np.float32]]] = []
        for part, score in zip(self._parts, scores, strict=True):
            matching = score > 0
            if part.alive is not None:
                matching &= part.alive
            if allowed is not None:
                matching &= np.isin(part.index._ids, np.asarray(allowed, dtype=np.int64))
            positions = np.flatnonzero(matching)
            if len(positions) > k:
                # Every chunk scoring at least the k-th best: ties at the cut break by id below.
                kth = -np.partition(-score[positions], k - 1)[k - 1]
                positions = positions[score[positions] >= kth]
            candidates.append((part.index._ids[positions], score[positions]))
        ids = np.concatenate([found for found, _ in candidates])
        values = np.concatenate([value for _, value in candidates])
        # Best first; equal scores in chunk id order, so results are deterministic.
        order = np.lexsort((ids, -values))[:k]
        return [Hit(int(ids[p]), float(values[p])) for p in order]


@dataclass(frozen=True)
class _Part:
    index: KeywordIndex
    alive: npt.NDArray[np.bool_] | None  # None: every chunk is live
    norm: npt.NDArray[np.float32]

    def postings(self, token: str) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]] | None:
        term = self.index.terms.get(token)
        if term is None:
            return None
        span = slice(self.index.indptr[term], self.index.indptr[term + 1])
        return self.index.rows[span], self.index.tf_weights[span]


def _array(values: Any, dtype: Any, length: int) -> Any:
    if values is None:
        return np.zeros(length, dtype=dtype)
    return np.ascontiguousarray(values, dtype=dtype)


_NO_IDS = np.zeros(0, dtype=np.int64)
