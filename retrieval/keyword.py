"""BM25 keyword indexes: segments of postings beside the FAISS segments, at the same versions.

Why bm25s (and not tantivy): bm25s analyses text the way Lucene's ``EnglishAnalyzer`` does
in pure Python over numpy, and an index is a folder of ``.npy`` arrays and a JSON
vocabulary (no pickle) that loads in milliseconds and needs no process, lock or commit
protocol of its own, so it is versioned exactly like the FAISS file it sits beside.
tantivy would bring a Rust engine with its own segment files, writer lock and commit
points: a second versioning scheme to keep in step with the vector index's.

A :class:`KeywordIndex` keeps the raw postings (term frequencies and chunk lengths) of
the chunks it was built from, not scores, so segments can be added and merged;
:mod:`retrieval.bm25` says why, and scores them. Text is analysed by
:mod:`retrieval.analysis`.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
import numpy.typing as npt

from retrieval.analysis import LANGUAGE, KeywordQuery, stemmer
from retrieval.bm25 import BM25Parameters, KeywordSearcher
from retrieval.errors import IndexCorrupted
from retrieval.files import folder_write, fsync_directory
from retrieval.hits import Hit

Ids = npt.NDArray[np.int64]

IDS_FILE = "ids.npy"
VOCABULARY_FILE = "vocabulary.json"


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
        self._searchers: dict[BM25Parameters, KeywordSearcher] = {}
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
            list(texts), stopwords=LANGUAGE, stemmer=stemmer(), show_progress=False
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

    def search(
        self,
        query: str | KeywordQuery,
        k: int,
        *,
        allowed: Ids | None = None,
        parameters: BM25Parameters | None = None,
    ) -> list[Hit]:
        """The ``k`` best chunks holding at least one of the query's terms, best first.

        ``query``: text, or its terms from :func:`keyword_query` (where a cap applies).
        ``allowed``: only these chunk ids may be returned; the mask applies to every
        chunk's score before the top ``k`` are taken. ``parameters``: BM25's k1 and b
        (None: bm25s's defaults).
        """
        return self._searcher(parameters or BM25Parameters()).search(query, k, allowed=allowed)

    def _searcher(self, parameters: BM25Parameters) -> KeywordSearcher:
        # One searcher per parameter set: it holds each chunk's length normalisation.
        if parameters not in self._searchers:
            self._searchers[parameters] = KeywordSearcher([(self, _NO_IDS)], parameters=parameters)
        return self._searchers[parameters]

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


def _array(values: Any, dtype: Any, length: int) -> Any:
    if values is None:
        return np.zeros(length, dtype=dtype)
    return np.ascontiguousarray(values, dtype=dtype)


_NO_IDS = np.zeros(0, dtype=np.int64)
