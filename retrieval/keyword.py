"""BM25 keyword indexes: one per collection, beside its FAISS index and at the same version.

Why bm25s (and not tantivy): bm25s is pure Python over numpy, with Lucene's BM25 scoring
precomputed into one sparse (CSC) matrix per index. A whole collection is scored for a
query in one sparse pass, so a metadata filter is a mask over that collection's chunks
applied inside the search, never a cut after a top-k; an index is a folder of ``.npy``
arrays and a JSON vocabulary (no pickle) that loads in milliseconds; and it needs no
process, lock or commit protocol of its own, so it is versioned exactly like the FAISS
file it sits beside. tantivy would bring a Rust engine with its own segment files, writer
lock and commit points: a second versioning scheme to keep in step with the vector
index's, for features (phrase queries, fuzzy matching) that ranking does not use here.

What bm25s lacks is an incremental add: a write rebuilds the collection's postings from
its chunk texts. ``bench/keyword_index.py`` measured the rebuild (tokenising dominates) at
3.4 s for 10k chunks and 37 s for 100k (2 shared, busy cores; plus reading the texts from
the database), with searches at 0.7 ms / 4.2 ms p50: fine for small collections, and the
reason delta segments come next for large ones.

Text is analysed much as Lucene's ``EnglishAnalyzer`` does it, fixed on principle rather
than tuned: lower case, words of two or more letters or digits, Lucene's 33 English stop
words removed, Snowball English (Porter 2) stems. ``XQ-7781-B`` is found by ``xq`` and
``7781``.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
import numpy.typing as npt
import Stemmer

from retrieval.errors import IndexCorrupted
from retrieval.hits import Hit

Ids = npt.NDArray[np.int64]

# bm25s sets its own logger to DEBUG at import, which would log every index build.
logging.getLogger("bm25s").setLevel(logging.WARNING)

LANGUAGE = "english"
IDS_FILE = "ids.npy"


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


class KeywordIndex:
    """BM25 over a set of chunks, each known by its chunk id (the same ids as FAISS's)."""

    def __init__(self, ids: Ids, model: Any = None) -> None:
        self._ids = np.ascontiguousarray(ids, dtype=np.int64)
        self._model: Any = model  # a bm25s.BM25; None when no chunk holds an indexable word
        if model is not None and int(model.scores["num_docs"]) != len(self._ids):
            raise IndexCorrupted(
                f"keyword index holds {model.scores['num_docs']} documents for {len(ids)} ids"
            )

    @classmethod
    def build(cls, ids: Sequence[int] | Ids, texts: Sequence[str]) -> KeywordIndex:
        """Index ``texts[i]`` under ``ids[i]``: bm25s's ``lucene`` BM25, k1 = 1.5, b = 0.75
        (its defaults, as in the BM25S paper's BEIR runs)."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
        if not len(ids):
            return cls(ids)
        # Token ids with their vocabulary straight from the tokenizer: no strings rebuilt.
        tokenized = bm25s.tokenize(
            list(texts), stopwords=LANGUAGE, stemmer=_stemmer(), show_progress=False
        )
        if not tokenized.vocab:  # not one indexable word in any chunk: nothing can match
            return cls(ids)
        model = bm25s.BM25(method="lucene")
        model.index(tokenized, show_progress=False)
        return cls(ids, model)

    def __len__(self) -> int:
        return len(self._ids)

    def ids(self) -> Ids:
        return self._ids.copy()

    def search(self, query: str, k: int, *, allowed: Ids | None = None) -> list[Hit]:
        """The ``k`` best chunks holding at least one of the query's terms, best first.

        ``allowed``: only these chunk ids may be returned; the mask applies to every
        chunk's score before the top ``k`` are taken.
        """
        if self._model is None or k <= 0:
            return []
        token_ids = self._model.get_tokens_ids(keyword_tokens([query])[0])
        if not token_ids:
            return []
        scores = np.asarray(self._model.get_scores_from_ids(token_ids), dtype=np.float32)
        matching = scores > 0
        if allowed is not None:
            matching &= np.isin(self._ids, np.asarray(allowed, dtype=np.int64))
        positions = np.flatnonzero(matching)
        if len(positions) > k:
            positions = positions[np.argpartition(-scores[positions], k - 1)[:k]]
        # Best first; equal scores in chunk id order, so results are deterministic.
        order = np.lexsort((self._ids[positions], -scores[positions]))
        return [Hit(int(self._ids[p]), float(scores[p])) for p in positions[order]]

    def write(self, path: Path) -> None:
        """Write atomically: a temporary folder beside ``path``, every file fsynced, then
        renamed into place. A folder already at ``path`` is a version whose transaction
        rolled back (versions only move forward under the collection's row lock)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        try:
            np.save(tmp / IDS_FILE, self._ids, allow_pickle=False)
            if self._model is not None:
                self._model.save(tmp, show_progress=False)
            for entry in tmp.iterdir():
                with open(entry, "rb") as handle:
                    os.fsync(handle.fileno())
            _fsync_directory(tmp)
            if path.exists():
                shutil.rmtree(path)
            os.rename(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _fsync_directory(path.parent)

    @classmethod
    def read(cls, path: Path) -> KeywordIndex:
        try:
            ids = np.load(path / IDS_FILE, allow_pickle=False)
            model = (
                bm25s.BM25.load(path, show_progress=False)
                if (path / "params.index.json").exists()
                else None
            )
        except (OSError, ValueError, KeyError) as exc:
            raise IndexCorrupted(f"cannot read keyword index {path}: {exc}") from exc
        if ids.dtype != np.int64 or ids.ndim != 1:
            raise IndexCorrupted(f"keyword index {path} has ids of shape {ids.shape} {ids.dtype}")
        return cls(ids, model)


def _fsync_directory(path: Path) -> None:
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
