"""A collection's index as segments: a base plus small deltas, minus tombstones.

Adding a document must not rewrite the collection's index (a rewrite grows with the
collection; see docs/scaling.md), so each write appends a *delta* segment: the vectors and
keyword postings of the chunks it adds, and the chunk ids it deletes from the segments
before it (tombstones). Compaction merges a base and its deltas into a new base, off the
request and ingest paths. :mod:`retrieval.store` keeps the segments on disk.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from retrieval.analysis import KeywordQuery
from retrieval.bm25 import BM25Parameters, KeywordSearcher
from retrieval.errors import IndexCorrupted
from retrieval.files import folder_write
from retrieval.hits import Hit
from retrieval.index import (
    Ids,
    IndexPolicy,
    VectorIndex,
    Vectors,
    ivf_lists,
    kind_for_size,
)
from retrieval.keyword import KeywordIndex

NO_IDS = np.zeros(0, dtype=np.int64)
VECTORS_FILE = "vectors.faiss"
TOMBSTONES_FILE = "tombstones.npy"


@dataclass(frozen=True)
class IndexState:
    """Which segments are live: the base made at ``base`` and the deltas after it, up to
    ``version`` (both 0: nothing indexed yet)."""

    base: int
    version: int

    @property
    def deltas(self) -> range:
        return range(self.base + 1, self.version + 1)


@dataclass(frozen=True, eq=False)
class Segment:
    """One write's chunks (vectors and postings, the same ids) and the ids it deletes from
    the segments before it. A segment never changes once written."""

    vectors: VectorIndex
    keywords: KeywordIndex
    tombstones: Ids = field(default_factory=lambda: NO_IDS)

    def __post_init__(self) -> None:
        if len(self.vectors) != len(self.keywords):
            raise IndexCorrupted(
                f"segment holds {len(self.vectors)} vectors and {len(self.keywords)} "
                "keyword entries"
            )

    @property
    def nbytes(self) -> int:
        return self.vectors.nbytes + self.keywords.nbytes + self.tombstones.nbytes

    def write_delta(self, path: Path) -> None:
        """Write as one folder: built under a temporary name, fsynced, renamed into place
        (replacing an orphan a rolled-back write left at this version)."""

        def fill(folder: Path) -> None:
            self.vectors.write(folder / VECTORS_FILE)
            np.save(folder / TOMBSTONES_FILE, self.tombstones, allow_pickle=False)
            self.keywords.write_into(folder)  # fsyncs every file in the folder, and the folder

        folder_write(path, fill)

    @classmethod
    def read_delta(cls, path: Path, *, dimension: int) -> Segment:
        if not path.is_dir():
            raise IndexCorrupted(f"index segment {path} is missing; run index_check --repair")
        try:
            tombstones = np.load(path / TOMBSTONES_FILE, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise IndexCorrupted(f"cannot read tombstones of {path}: {exc}") from exc
        return cls(
            VectorIndex.read(path / VECTORS_FILE, dimension=dimension),
            KeywordIndex.read(path),
            np.asarray(tombstones, dtype=np.int64),
        )


class SegmentedIndex:
    """Base + deltas minus tombstones, searched as one index of the live chunks.

    Dense search asks each segment for its best ``k`` among its live (and allowed) ids
    and keeps the best ``k`` of those: with flat storage exactly the top ``k`` of one
    index rebuilt from the same vectors. Keyword search scores with the statistics of
    all live chunks (:class:`~retrieval.bm25.KeywordSearcher`).
    """

    def __init__(self, segments: Sequence[Segment]) -> None:
        self.segments = list(segments)
        # A segment's dead ids: those deleted by any later segment.
        self.dead: list[Ids] = []
        later = NO_IDS
        for segment in reversed(self.segments):
            self.dead.append(later)
            if len(segment.tombstones):
                later = np.union1d(later, segment.tombstones)
        self.dead.reverse()
        self._live = [
            segment.vectors.ids()[~np.isin(segment.vectors.ids(), dead)]
            if len(dead)
            else segment.vectors.ids()
            for segment, dead in zip(self.segments, self.dead, strict=True)
        ]
        self._keywords: dict[BM25Parameters, KeywordSearcher] = {}

    def __len__(self) -> int:
        return sum(len(live) for live in self._live)

    @property
    def nbytes(self) -> int:
        return sum(segment.nbytes for segment in self.segments)

    @property
    def tombstone_ratio(self) -> float:
        """Share of the vectors held that are dead: what compaction would drop."""
        held = sum(len(segment.vectors) for segment in self.segments)
        return 1 - len(self) / held if held else 0.0

    def ids(self) -> Ids:
        return np.concatenate(self._live) if self._live else NO_IDS

    def search(self, queries: Vectors, k: int, *, allowed: Ids | None = None) -> list[list[Hit]]:
        """The ``k`` nearest live vectors to each query, best first (equal scores by id)."""
        found = [
            segment.vectors.search(queries, k, allowed=allowed, excluded=dead)
            for segment, dead in zip(self.segments, self.dead, strict=True)
        ]
        return [
            sorted(itertools.chain(*rows), key=lambda hit: (-hit.score, hit.id))[:k]
            for rows in zip(*found, strict=True)
        ]

    def keyword_search(
        self,
        query: str | KeywordQuery,
        k: int,
        *,
        allowed: Ids | None = None,
        parameters: BM25Parameters | None = None,
    ) -> list[Hit]:
        """BM25 over the live chunks with ``parameters`` (None: bm25s's k1 and b)."""
        parameters = parameters or BM25Parameters()
        if parameters not in self._keywords:
            # One searcher per parameter set: it holds each chunk's length normalisation.
            self._keywords[parameters] = KeywordSearcher(
                [(s.keywords, dead) for s, dead in zip(self.segments, self.dead, strict=True)],
                parameters=parameters,
            )
        return self._keywords[parameters].search(query, k, allowed=allowed)

    def compact(
        self,
        *,
        policy: IndexPolicy,
        pq_m: int = 0,
        exact_vectors: Callable[[Ids], Vectors] | None = None,
    ) -> Segment:
        """One base segment holding exactly the live chunks.

        The base is kept and patched (its dead ids removed, the deltas' live vectors
        added) while it is of the kind its new size calls for; otherwise, or when an IVF
        index has grown enough that its cells should double, every live vector goes into a
        freshly built (and trained) index. ``exact_vectors(ids)`` supplies exact vectors
        where the base holds PQ approximations.
        """
        base, size = self.segments[0], len(self)
        kind = kind_for_size(policy, size)
        old = base.vectors
        keep = old.kind == kind and len(old) > 0
        if kind == "ivf" and keep:
            keep = ivf_lists(size) < 2 * old.lists and bool(old.pq_m == pq_m)
        if keep:
            vectors = old.copy()
            vectors.remove(self.dead[0])
            for segment, live in zip(self.segments[1:], self._live[1:], strict=True):
                if len(live):
                    ids, held = segment.vectors.vectors()
                    vectors.add(live, held[np.isin(ids, live)])
        else:
            ids, held = self.live_vectors()
            if old.pq_m and exact_vectors is not None:
                held = exact_vectors(ids)
            vectors = VectorIndex.build(old.dimension, kind, ids=ids, vectors=held, pq_m=pq_m)
        keywords = KeywordIndex.merge(
            [(s.keywords, dead) for s, dead in zip(self.segments, self.dead, strict=True)]
        )
        return Segment(vectors, keywords)

    def live_vectors(self) -> tuple[Ids, Vectors]:
        parts_ids, parts_vectors = [], []
        for segment, live in zip(self.segments, self._live, strict=True):
            ids, held = segment.vectors.vectors()
            keep = np.isin(ids, live)
            parts_ids.append(ids[keep])
            parts_vectors.append(held[keep])
        return np.concatenate(parts_ids), np.concatenate(parts_vectors)
