"""FAISS vector indexes: one per collection, so isolation between teams holds by construction.

An index maps chunk ids (int64 database keys) to normalised vectors and answers inner-product
(cosine) searches. Files are versioned: each write goes to a temporary file that is fsynced
and renamed into ``<root>/<collection>/<version>.faiss``, and the database row records which
version is current. A reader therefore either sees the old index or the new one, never a
torn file, and a write whose transaction rolls back leaves the current version untouched.
The collection's keyword index (:mod:`retrieval.keyword`) is written beside it at the same
version, as ``<version>.bm25/``, so one version number names both.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np
import numpy.typing as npt

from retrieval.errors import IndexCorrupted
from retrieval.hits import Hit
from retrieval.keyword import KeywordIndex

logger = logging.getLogger(__name__)

IndexKind = Literal["flat", "hnsw"]
Ids = npt.NDArray[np.int64]
Vectors = npt.NDArray[np.float32]

HNSW_NEIGHBOURS = 32


def set_search_threads(threads: int) -> None:
    """OpenMP threads FAISS uses; for one query at a time, one is faster than two here."""
    if threads > 0:
        faiss.omp_set_num_threads(threads)


def gpu_count() -> int:
    return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0


class VectorIndex:
    """An ``IndexIDMap2`` over inner-product flat (exact) or HNSW (approximate) storage."""

    def __init__(self, dimension: int, kind: IndexKind = "flat", *, raw: Any = None) -> None:
        self.dimension = dimension
        self.kind = kind
        if raw is None:
            inner: Any
            if kind == "hnsw":
                inner = faiss.IndexHNSWFlat(dimension, HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
            else:
                inner = faiss.IndexFlatIP(dimension)
            raw = faiss.IndexIDMap2(inner)
        self._raw: Any = raw
        self._searchable: Any = _to_gpu(raw)

    def __len__(self) -> int:
        return int(self._raw.ntotal)

    def ids(self) -> Ids:
        return np.asarray(faiss.vector_to_array(self._raw.id_map), dtype=np.int64)

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
        if self.kind == "flat":
            removed = int(self._raw.remove_ids(faiss.IDSelectorBatch(ids)))
        else:  # HNSW graphs cannot drop nodes: rebuild from the vectors that stay.
            present = self.ids()
            keep = ~np.isin(present, ids)
            removed = int((~keep).sum())
            if removed:
                kept_ids = present[keep]
                vectors = (
                    np.vstack([self._raw.reconstruct(int(i)) for i in kept_ids])
                    if len(kept_ids)
                    else np.zeros((0, self.dimension), dtype=np.float32)
                )
                fresh = VectorIndex(self.dimension, self.kind)
                fresh.add(kept_ids, vectors)
                self._raw = fresh._raw
        self._searchable = _to_gpu(self._raw)
        return removed

    def search(self, queries: Vectors, k: int, *, allowed: Ids | None = None) -> list[list[Hit]]:
        """The ``k`` nearest vectors to each query, best first.

        ``allowed``: only these ids may be returned. FAISS applies the selector while it
        scans (flat) or walks the graph (HNSW), so the ``k`` are the best allowed ones,
        not what is left of an unfiltered top ``k``.
        """
        queries = _as_matrix(queries, self.dimension)
        if not len(self) or k <= 0:
            return [[] for _ in range(len(queries))]
        if allowed is None:
            scores, ids = self._searchable.search(queries, min(k, len(self)))
        else:
            allowed = np.ascontiguousarray(allowed, dtype=np.int64)
            if not len(allowed):
                return [[] for _ in range(len(queries))]
            k = min(k, len(self), len(allowed))
            selector = faiss.IDSelectorBatch(allowed)
            # (faiss's bundled type stubs lack the search parameter classes' fields)
            if self.kind == "hnsw":
                # A selective filter leaves few allowed nodes on the graph's paths: widen
                # the beam so the walk still finds k of them.
                params: Any = faiss.SearchParametersHNSW(  # type: ignore[attr-defined]
                    sel=selector, efSearch=max(4 * k, 64)
                )
            else:
                params = faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]
            # GPU indexes take no selectors: a filtered search runs on the CPU copy.
            scores, ids = self._raw.search(queries, k, params=params)
        return [
            [Hit(int(i), float(s)) for i, s in zip(row_ids, row_scores, strict=True) if i >= 0]
            for row_ids, row_scores in zip(ids, scores, strict=True)
        ]

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
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    @classmethod
    def read(cls, path: Path, *, dimension: int) -> VectorIndex:
        try:
            raw = faiss.read_index(str(path))
        except RuntimeError as exc:
            raise IndexCorrupted(f"cannot read index {path}: {exc}") from exc
        if raw.d != dimension:
            raise IndexCorrupted(f"index {path} has dimension {raw.d}, expected {dimension}")
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


_VERSION_FILE = re.compile(r"^(\d+)\.(faiss|bm25)$")


class IndexStore:
    """Versioned index files under a root folder, with a per-process cache of loaded ones.

    Each version of a collection is a vector index file and a keyword index folder.
    """

    def __init__(self, root: Path, *, dimension: int, kind: IndexKind = "flat") -> None:
        self.root = Path(root)
        self.dimension = dimension
        self.kind = kind
        self._cache: dict[str, tuple[int, VectorIndex]] = {}
        self._keyword_cache: dict[str, tuple[int, KeywordIndex]] = {}
        self._lock = threading.Lock()

    def path(self, key: str, version: int) -> Path:
        return self.root / key / f"{version:010d}.faiss"

    def keyword_path(self, key: str, version: int) -> Path:
        return self.root / key / f"{version:010d}.bm25"

    def load(self, key: str, version: int) -> VectorIndex:
        """The index at ``version``; an empty one for version 0 (nothing indexed yet).

        Cached per process and reloaded only when the version asked for changes.
        """
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] == version:
                return cached[1]
        index = self.load_copy(key, version)
        with self._lock:
            self._cache[key] = (version, index)
        return index

    def load_copy(self, key: str, version: int) -> VectorIndex:
        """A private copy, read from disk, to modify: the cached one is shared by searches."""
        if version == 0:
            return VectorIndex(self.dimension, self.kind)
        path = self.path(key, version)
        if not path.exists():
            raise IndexCorrupted(f"index file {path} is missing; run index_check --repair")
        return VectorIndex.read(path, dimension=self.dimension)

    def load_keyword(self, key: str, version: int) -> KeywordIndex:
        """The keyword index at ``version`` (empty at 0), cached like :meth:`load`."""
        with self._lock:
            cached = self._keyword_cache.get(key)
            if cached is not None and cached[0] == version:
                return cached[1]
        index = self.load_keyword_copy(key, version)
        with self._lock:
            self._keyword_cache[key] = (version, index)
        return index

    def load_keyword_copy(self, key: str, version: int) -> KeywordIndex:
        """The keyword index at ``version`` read from disk, bypassing the cache."""
        if version == 0:
            return KeywordIndex(np.zeros(0, dtype=np.int64))
        path = self.keyword_path(key, version)
        if not path.is_dir():
            raise IndexCorrupted(f"keyword index {path} is missing; run index_check --repair")
        return KeywordIndex.read(path)

    def save(
        self,
        key: str,
        version: int,
        index: VectorIndex,
        keyword: KeywordIndex | None = None,
        *,
        cache: bool = True,
    ) -> Path:
        """Write ``version``: the keyword index (when given) first, then the vector file.

        ``cache=False`` leaves the cache alone: for a writer whose version becomes current
        only when its transaction commits (it calls :meth:`remember` then), so that a
        rolled-back version never answers a search in this process.
        """
        if keyword is not None:
            keyword.write(self.keyword_path(key, version))
        path = self.path(key, version)
        index.write(path)
        if cache:
            self.remember(key, version, index, keyword)
        return path

    def remember(
        self, key: str, version: int, index: VectorIndex, keyword: KeywordIndex | None = None
    ) -> None:
        """Cache indexes known to be ``version``'s, as if just loaded."""
        with self._lock:
            self._cache[key] = (version, index)
            if keyword is not None:
                self._keyword_cache[key] = (version, keyword)

    def prune(self, key: str, *, keep_from: int) -> None:
        """Delete versions older than ``keep_from`` (kept one behind for in-flight readers)."""
        folder = self.root / key
        if not folder.is_dir():
            return
        for entry in folder.iterdir():
            match = _VERSION_FILE.match(entry.name)
            if match and int(match.group(1)) < keep_from:
                _remove(entry)

    def drop(self, key: str) -> None:
        with self._lock:
            self._cache.pop(key, None)
            self._keyword_cache.pop(key, None)
        folder = self.root / key
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)


def _remove(entry: Path) -> None:
    if entry.is_dir():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)
