"""FAISS vector indexes: one per collection segment, so isolation between teams holds by
construction.

An index maps chunk ids (int64 database keys) to normalised vectors and answers inner-product
(cosine) searches. Three kinds share the one :class:`VectorIndex` contract:

- ``flat``: exact; every query scans every vector. Delta segments are always flat.
- ``hnsw``: a graph (M = 32); fast to query, but slow to build, and a removal rebuilds it
  (graphs cannot drop nodes).
- ``ivf``: inverted lists over k-means cells (nlist = 4 sqrt(n)), trained when the index is
  built (see :func:`kind_for_size`), retrained once the collection has grown enough that the
  right nlist doubles; ``nprobe`` cells are scanned. The lists hold the vectors themselves
  (IVF-Flat) by default; ``pq_m`` > 0 stores them as PQ codes instead (IVF-PQ, a fraction of
  the memory at a recall well below exact search's: docs/scaling.md).

Files are written atomically (temporary file, fsync, rename); :mod:`retrieval.store` says
which files make up a collection's current index.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np
import numpy.typing as npt

from retrieval.errors import IndexCorrupted
from retrieval.files import fsync_directory
from retrieval.hits import Hit

logger = logging.getLogger(__name__)

IndexKind = Literal["flat", "hnsw", "ivf"]
# The setting: a kind, or ``auto`` to choose by size (:func:`kind_for_size`).
IndexPolicy = Literal["flat", "hnsw", "ivf", "auto"]
Ids = npt.NDArray[np.int64]
Vectors = npt.NDArray[np.float32]

HNSW_NEIGHBOURS = 32
# Beam width of a search (faiss's default is 16): recall@10 >= 0.95 (tests/retrieval/).
HNSW_BEAM = 64
# ``auto`` switches kind at these sizes (bench/index_kinds.py, docs/scaling.md): flat is
# exact and cheap below 50k; HNSW's recall@10 fell from 0.99 at 100k to 0.85 at 1M (0.94
# at efSearch 512) where IVF kept 1.00, and IVF compacts in place where HNSW rebuilds.
AUTO_HNSW_FROM = 50_000
AUTO_IVF_FROM = 500_000
# Below this an ``ivf`` index is flat: k-means needs ~39 points per cell to train on.
IVF_MIN_SIZE = 50_000


def kind_for_size(policy: IndexPolicy, size: int) -> IndexKind:
    """The kind a collection of ``size`` vectors is built as under the ``policy`` setting."""
    if policy == "auto":
        if size >= AUTO_IVF_FROM:
            return "ivf"
        return "hnsw" if size >= AUTO_HNSW_FROM else "flat"
    if policy == "ivf" and size < IVF_MIN_SIZE:
        return "flat"
    return policy


def ivf_lists(size: int) -> int:
    """Cells for ``size`` vectors: 4 sqrt(n), the low end of faiss's guidance (4-16 sqrt(n))."""
    return max(1, int(4 * math.sqrt(size)))


def ivf_probes(lists: int) -> int:
    """Cells scanned per query: enough for recall@10 >= 0.95 (tests/retrieval/test_kinds.py)."""
    return min(lists, max(32, lists // 16))


def set_search_threads(threads: int) -> None:
    """OpenMP threads FAISS uses; for one query at a time, one is faster than two here."""
    if threads > 0:
        faiss.omp_set_num_threads(threads)


def gpu_count() -> int:
    return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0


class VectorIndex:
    """Flat (exact), HNSW or IVF storage of chunk ids and their vectors."""

    def __init__(self, dimension: int, kind: IndexKind = "flat", *, raw: Any = None) -> None:
        self.dimension = dimension
        self.kind = kind
        if raw is None:
            inner: Any
            if kind == "hnsw":
                inner = faiss.IndexHNSWFlat(dimension, HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
                inner.hnsw.efSearch = HNSW_BEAM
            elif kind == "flat":
                inner = faiss.IndexFlatIP(dimension)
            else:
                raise ValueError("an ivf index is trained on its vectors: use VectorIndex.build")
            raw = faiss.IndexIDMap2(inner)
        self._raw: Any = raw
        self._searchable: Any = _to_gpu(raw)

    @classmethod
    def build(
        cls, dimension: int, kind: IndexKind, *, ids: Ids, vectors: Vectors, pq_m: int = 0
    ) -> VectorIndex:
        """An index of ``kind`` holding ``vectors`` under ``ids``; an ivf one is trained on
        (a sample of) them first."""
        vectors = _as_matrix(vectors, dimension)
        if kind != "ivf":
            index = cls(dimension, kind)
            index.add(ids, vectors)
            return index
        lists = ivf_lists(len(vectors))
        quantizer = faiss.IndexFlatIP(dimension)
        raw: Any
        if pq_m:
            raw = faiss.IndexIVFPQ(quantizer, dimension, lists, pq_m, 8, faiss.METRIC_INNER_PRODUCT)
        else:
            raw = faiss.IndexIVFFlat(quantizer, dimension, lists, faiss.METRIC_INNER_PRODUCT)
        # 64 points per cell: faiss warns below 39; more costs time and gains little.
        sample = min(len(vectors), 64 * lists)
        picked = np.random.default_rng(0).choice(len(vectors), size=sample, replace=False)
        raw.train(vectors[np.sort(picked)])
        raw.nprobe = ivf_probes(lists)
        index = cls(dimension, "ivf", raw=raw)
        index.add(ids, vectors)
        return index

    def __len__(self) -> int:
        return int(self._raw.ntotal)

    def copy(self) -> VectorIndex:
        """A private copy to modify: a loaded index is shared by searches."""
        return VectorIndex(self.dimension, self.kind, raw=faiss.clone_index(self._raw))

    @property
    def pq_m(self) -> int:
        """PQ sub-quantizers of an IVF-PQ index (0: exact vectors)."""
        raw = faiss.downcast_index(self._raw)
        return int(raw.pq.M) if isinstance(raw, faiss.IndexIVFPQ) else 0

    @property
    def lists(self) -> int:
        """IVF cells (0 for other kinds)."""
        return int(self._raw.nlist) if self.kind == "ivf" else 0

    @property
    def nbytes(self) -> int:
        """Memory held, roughly: what the cache of loaded indexes counts."""
        count = len(self)
        if self.kind == "ivf":
            code = int(self._raw.code_size)
            return count * (code + 8) + self.lists * self.dimension * 4
        per_vector = self.dimension * 4 + 24  # vector, id and its reverse-map entry
        if self.kind == "hnsw":
            per_vector += HNSW_NEIGHBOURS * 2 * 4 + 8
        return count * per_vector

    def ids(self) -> Ids:
        if self.kind == "ivf":
            return self._ivf_entries(with_vectors=False)[0]
        return np.asarray(faiss.vector_to_array(self._raw.id_map), dtype=np.int64)

    def vectors(self) -> tuple[Ids, Vectors]:
        """Every id with its vector, exactly as stored (IVF-PQ's are approximations)."""
        if self.kind == "ivf":
            return self._ivf_entries(with_vectors=True)
        ids = self.ids()
        storage: Any = faiss.downcast_index(self._raw.index)
        if self.kind == "hnsw":
            storage = faiss.downcast_index(storage.storage)
        flat = faiss.vector_to_array(storage.codes).view(np.float32)
        return ids, flat.reshape(-1, self.dimension).copy()

    def _ivf_entries(self, *, with_vectors: bool) -> tuple[Ids, Vectors]:
        """Read from the inverted lists: an IVF-Flat list's codes are its vectors; an
        IVF-PQ entry is decoded one by one (the rare path: retraining such an index)."""
        lists = self._raw.invlists
        pq = self.pq_m > 0
        ids: list[Ids] = []
        vectors: list[Vectors] = []
        for cell in range(lists.nlist):
            size = lists.list_size(cell)
            if not size:
                continue
            ids.append(np.array(faiss.rev_swig_ptr(lists.get_ids(cell), size), dtype=np.int64))
            if not with_vectors:
                continue
            if pq:
                vectors.append(
                    np.vstack(
                        [self._raw.reconstruct_from_offset(cell, o) for o in range(size)]
                    ).astype(np.float32)
                )
            else:
                codes = faiss.rev_swig_ptr(lists.get_codes(cell), size * lists.code_size)
                vectors.append(
                    np.frombuffer(bytes(codes), dtype=np.float32).reshape(size, self.dimension)
                )
        every = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        if not vectors:
            return every, np.zeros((0, self.dimension), dtype=np.float32)
        return every, np.vstack(vectors)

    def add(self, ids: Ids, vectors: Vectors) -> None:
        vectors = _as_matrix(vectors, self.dimension)
        if len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids for {len(vectors)} vectors")
        if len(ids):
            self._raw.add_with_ids(vectors, np.ascontiguousarray(ids, dtype=np.int64))
            self._searchable = _to_gpu(self._raw)

    def remove(self, ids: Ids) -> int:
        """Remove ``ids``; returns how many were present."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if not len(ids) or not len(self):
            return 0
        if self.kind != "hnsw":
            removed = int(self._raw.remove_ids(faiss.IDSelectorBatch(ids)))
        else:  # HNSW graphs cannot drop nodes: rebuild from the vectors that stay.
            present, vectors = self.vectors()
            keep = ~np.isin(present, ids)
            removed = int((~keep).sum())
            if removed:
                self._raw = VectorIndex.build(
                    self.dimension, self.kind, ids=present[keep], vectors=vectors[keep]
                )._raw
        self._searchable = _to_gpu(self._raw)
        return removed

    def search(
        self,
        queries: Vectors,
        k: int,
        *,
        allowed: Ids | None = None,
        excluded: Ids | None = None,
    ) -> list[list[Hit]]:
        """The ``k`` nearest vectors to each query, best first.

        ``allowed``: only these ids may be returned; ``excluded``: these may not (the
        tombstones of later segments). FAISS applies the selector while it scans (flat,
        IVF) or walks the graph (HNSW), so the ``k`` are the best allowed ones, not what
        is left of an unfiltered top ``k``.
        """
        queries = _as_matrix(queries, self.dimension)
        if allowed is not None:
            allowed = np.ascontiguousarray(allowed, dtype=np.int64)
            if excluded is not None and len(excluded):
                allowed = np.setdiff1d(allowed, excluded, assume_unique=False)
        if not len(self) or k <= 0 or (allowed is not None and not len(allowed)):
            return [[] for _ in range(len(queries))]
        k = min(k, len(self)) if allowed is None else min(k, len(self), len(allowed))
        if allowed is None and (excluded is None or not len(excluded)):
            scores, ids = self._searchable.search(queries, k)
        else:
            selector: Any = (
                faiss.IDSelectorBatch(allowed)
                if allowed is not None
                else faiss.IDSelectorNot(
                    faiss.IDSelectorBatch(np.ascontiguousarray(excluded, dtype=np.int64))
                )
            )
            # GPU indexes take no selectors: a filtered search runs on the CPU copy.
            scores, ids = self._raw.search(queries, k, params=self._parameters(selector, k))
        return [
            [Hit(int(i), float(s)) for i, s in zip(row_ids, row_scores, strict=True) if i >= 0]
            for row_ids, row_scores in zip(ids, scores, strict=True)
        ]

    def _parameters(self, selector: Any, k: int) -> Any:
        # (faiss's bundled type stubs lack the search parameter classes' fields)
        if self.kind == "hnsw":
            # A selective filter leaves few allowed nodes on the graph's paths: widen
            # the beam so the walk still finds k of them.
            return faiss.SearchParametersHNSW(  # type: ignore[attr-defined]
                sel=selector, efSearch=max(4 * k, HNSW_BEAM)
            )
        if self.kind == "ivf":
            return faiss.SearchParametersIVF(  # type: ignore[call-arg]
                sel=selector, nprobe=int(self._raw.nprobe)
            )
        return faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]

    def write(self, path: Path) -> None:
        """Write atomically: temp file in the same folder, fsync, rename, fsync the folder."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.close(fd)
            faiss.write_index(self._raw, tmp)
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_directory(path.parent)

    @classmethod
    def read(cls, path: Path, *, dimension: int) -> VectorIndex:
        try:
            raw = faiss.read_index(str(path))
        except RuntimeError as exc:
            raise IndexCorrupted(f"cannot read index {path}: {exc}") from exc
        if raw.d != dimension:
            raise IndexCorrupted(f"index {path} has dimension {raw.d}, expected {dimension}")
        if isinstance(raw, faiss.IndexIVF):
            return cls(dimension, "ivf", raw=raw)
        inner = faiss.downcast_index(getattr(raw, "index", raw))
        kind: IndexKind = "hnsw" if isinstance(inner, faiss.IndexHNSW) else "flat"
        return cls(dimension, kind, raw=raw)


def _as_matrix(vectors: Vectors, dimension: int) -> Vectors:
    matrix = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, dimension)
    return matrix


def _to_gpu(raw: Any) -> Any:
    """Search on the GPU when faiss reports one; exact flat indexes move, HNSW stays on CPU."""
    if gpu_count() == 0 or not hasattr(faiss, "index_cpu_to_all_gpus"):
        return raw
    try:
        return faiss.index_cpu_to_all_gpus(raw)
    except RuntimeError:  # an index type without a GPU implementation
        logger.info("index type %s stays on the CPU", type(raw).__name__)
        return raw
