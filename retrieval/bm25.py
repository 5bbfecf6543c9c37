"""BM25 over keyword segments, scored with the statistics of their live chunks together.

Why the scores are computed here and not by bm25s: bm25s precomputes each (chunk, term)
score with the collection's IDF and mean length baked in, so it has no incremental add
and two bm25s indexes cannot be merged: any write rebuilt the whole collection. A
:class:`~retrieval.keyword.KeywordIndex` keeps instead the raw postings (term
frequencies and chunk lengths) of the chunks it was built from, and
:class:`KeywordSearcher` scores a query over any set of such segments with the
statistics (chunk count, document frequencies, mean length) of their live chunks taken
together: exactly bm25s's ``lucene`` BM25 (k1 = 1.5, b = 0.75 by default, idf = ln(1 + (N - df +
0.5) / (df + 0.5)), tf / (tf + k1 (1 - b + b dl / avgdl))). So a base plus delta segments
minus tombstones ranks exactly as one index rebuilt from the same chunks (the same sums
of the same terms, bit for bit), and adding a document tokenises only that document.
The price is paid per query: each posting's length normalisation is computed then, not
stored (what that costs against bm25s, from ``bench/keyword_index.py``: docs/scaling.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from retrieval.analysis import KeywordQuery, keyword_query
from retrieval.hits import Hit

if TYPE_CHECKING:
    from retrieval.keyword import Ids, KeywordIndex

# bm25s's defaults, as in the BM25S paper's BEIR runs.
K1 = 1.5
B = 0.75


@dataclass(frozen=True, slots=True)
class BM25Parameters:
    """BM25's term-frequency saturation ``k1`` and length normalisation ``b``.

    Both apply at query time (the postings keep raw term frequencies), so changing them
    needs no reindex. The product's values are settings (``KEYWORD_BM25_K1``,
    ``KEYWORD_BM25_B``), chosen on SciFact's dev split: docs/retrieval.md.
    """

    k1: float = K1
    b: float = B

    def __post_init__(self) -> None:
        if self.k1 < 0:
            raise ValueError(f"BM25 k1 must be >= 0, not {self.k1}")
        if not 0.0 <= self.b <= 1.0:
            raise ValueError(f"BM25 b must be in [0, 1], not {self.b}")


class KeywordSearcher:
    """BM25 over several segments as if they were one index of their live chunks.

    ``parts``: each segment with the chunk ids dead in it (deleted, or replaced by a later
    segment). N, the document frequencies and the mean length count live chunks only, so
    the scores are those of one index built from exactly those chunks.
    """

    def __init__(
        self,
        parts: Sequence[tuple[KeywordIndex, Ids]],
        *,
        parameters: BM25Parameters = BM25Parameters(),
    ) -> None:
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
        k1, b = parameters.k1, parameters.b
        # Per chunk, the part of BM25's denominator that does not depend on the term.
        self._parts = [
            _Part(index, a, (k1 * ((1 - b) + b * index.lengths / mean_length)).astype(np.float32))
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
