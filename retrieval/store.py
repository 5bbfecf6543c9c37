"""A collection's segments (:mod:`retrieval.segments`) on disk, and a cache of them.

On disk, under ``<root>/<collection>/``:

- ``<n>.faiss`` and ``<n>.bm25/``: the base made at version ``n``;
- ``<n>.delta/``: the delta written at version ``n`` (``vectors.faiss``, ``tombstones.npy``
  and the keyword arrays), one folder renamed into place in one step.

The database row names the live set with two numbers, :class:`IndexState`: the base and
the last version; the deltas are every version after the base. A file outside that set
is ignored by searches: either one version behind (kept for searches that read the row
just before a write; pruned by the next compaction) or an orphan left by a write whose
transaction never committed, which the next write at that version replaces and
:meth:`IndexStore.orphans` lists for ``index_check --repair``.
"""

from __future__ import annotations

import re
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Literal

from retrieval.errors import IndexCorrupted
from retrieval.index import IndexPolicy, VectorIndex
from retrieval.keyword import KeywordIndex
from retrieval.segments import NO_IDS, IndexState, Segment, SegmentedIndex

SegmentRole = Literal["base", "delta"]
_ENTRY = re.compile(r"^(\d+)\.(faiss|bm25|delta)$")


class IndexStore:
    """Segment files under a root folder, with a per-process cache of loaded segments.

    The cache is a least-recently-used map bounded in bytes (``cache_bytes``; 0: no
    bound): a web process serving many collections keeps the ones it searches, and one
    whose base no longer fits is still served (it is the only entry then), never refused.
    """

    def __init__(
        self,
        root: Path,
        *,
        dimension: int,
        policy: IndexPolicy = "flat",
        pq_m: int = 0,
        cache_bytes: int = 0,
    ) -> None:
        self.root = Path(root)
        self.dimension = dimension
        self.policy = policy
        self.pq_m = pq_m
        self.cache_bytes = cache_bytes
        self._segments: OrderedDict[tuple[str, SegmentRole, int], Segment] = OrderedDict()
        self._cached_bytes = 0
        self._views: dict[str, tuple[IndexState, SegmentedIndex]] = {}
        self._lock = threading.Lock()

    # Paths -------------------------------------------------------------------------------

    def path(self, key: str, version: int) -> Path:
        """The vector file of the base made at ``version``."""
        return self.root / key / f"{version:010d}.faiss"

    def keyword_path(self, key: str, version: int) -> Path:
        """The keyword folder of the base made at ``version``."""
        return self.root / key / f"{version:010d}.bm25"

    def delta_path(self, key: str, version: int) -> Path:
        return self.root / key / f"{version:010d}.delta"

    # Reading -----------------------------------------------------------------------------

    def load(self, key: str, state: IndexState) -> SegmentedIndex:
        """The live segments of ``state`` as one index; segments come from the cache when
        loaded before (a new delta costs one small read, not the base again)."""
        with self._lock:
            view = self._views.get(key)
            if view is not None and view[0] == state:
                for entry in [(key, "base", state.base)] + [
                    (key, "delta", v) for v in state.deltas
                ]:
                    if entry in self._segments:
                        self._segments.move_to_end(entry)  # type: ignore[arg-type]
                return view[1]
        segments = [self.segment(*entry) for entry in self._entries_of(key, state)]
        loaded = SegmentedIndex(segments)
        with self._lock:
            self._views[key] = (state, loaded)
        return loaded

    @staticmethod
    def _entries_of(key: str, state: IndexState) -> list[tuple[str, SegmentRole, int]]:
        deltas: list[tuple[str, SegmentRole, int]] = [(key, "delta", v) for v in state.deltas]
        return [(key, "base", state.base), *deltas]

    def segment(self, key: str, role: SegmentRole, version: int) -> Segment:
        with self._lock:
            cached = self._segments.get((key, role, version))
            if cached is not None:
                self._segments.move_to_end((key, role, version))
                return cached
        loaded = self.read(key, role, version)
        self._remember(key, role, version, segment=loaded)
        return loaded

    def read_state(self, key: str, state: IndexState) -> SegmentedIndex:
        """The live segments of ``state`` read from disk, bypassing the cache."""
        return SegmentedIndex([self.read(*entry) for entry in self._entries_of(key, state)])

    def read(self, key: str, role: SegmentRole, version: int) -> Segment:
        """A segment from disk, bypassing the cache; the empty base at version 0."""
        if role == "delta":
            return Segment.read_delta(self.delta_path(key, version), dimension=self.dimension)
        if version == 0:
            return Segment(VectorIndex(self.dimension), KeywordIndex(NO_IDS))
        path = self.path(key, version)
        if not path.exists():
            raise IndexCorrupted(f"index file {path} is missing; run index_check --repair")
        return Segment(
            VectorIndex.read(path, dimension=self.dimension), self.read_keywords(key, version)
        )

    def read_keywords(self, key: str, version: int) -> KeywordIndex:
        path = self.keyword_path(key, version)
        if not path.is_dir():
            raise IndexCorrupted(f"keyword index {path} is missing; run index_check --repair")
        return KeywordIndex.read(path)

    # Writing -----------------------------------------------------------------------------

    def write_base(self, key: str, version: int, segment: Segment) -> None:
        """The keyword folder first, then the vector file: a base whose vector file exists
        is complete."""
        segment.keywords.write(self.keyword_path(key, version))
        segment.vectors.write(self.path(key, version))

    def write_delta(self, key: str, version: int, segment: Segment) -> None:
        segment.write_delta(self.delta_path(key, version))

    def remember(self, key: str, role: SegmentRole, version: int, *, segment: Segment) -> None:
        """Cache a segment known to be live, as if just loaded: for a writer once its
        transaction has committed (a rolled-back one never answers a search here)."""
        self._remember(key, role, version, segment=segment)

    def _remember(self, key: str, role: SegmentRole, version: int, *, segment: Segment) -> None:
        entry = (key, role, version)
        with self._lock:
            previous = self._segments.pop(entry, None)
            if previous is not None:
                self._cached_bytes -= previous.nbytes
            self._segments[entry] = segment
            self._cached_bytes += segment.nbytes
            while self.cache_bytes and self._cached_bytes > self.cache_bytes:
                if len(self._segments) == 1:
                    break
                (evicted_key, *_), evicted = self._segments.popitem(last=False)
                self._cached_bytes -= evicted.nbytes
                self._views.pop(evicted_key, None)  # a view would keep it in memory

    @property
    def cached_bytes(self) -> int:
        return self._cached_bytes

    def cached(self) -> list[tuple[str, SegmentRole, int]]:
        """The cached segments, least recently used first."""
        with self._lock:
            return list(self._segments)

    def forget(self, key: str) -> None:
        """Drop a collection from this process's cache (its files stay)."""
        with self._lock:
            self._views.pop(key, None)
            for entry in [entry for entry in self._segments if entry[0] == key]:
                self._cached_bytes -= self._segments.pop(entry).nbytes

    # Cleaning ----------------------------------------------------------------------------

    def prune(self, key: str, *, base_before: int) -> None:
        """After a new base: delete what only states before ``base_before`` (the previous
        base, still read by searches that loaded the row just before) could use."""
        for entry, version, suffix in self._entries(key):
            if version < base_before or (suffix == "delta" and version <= base_before):
                _remove(entry)

    def orphans(self, key: str, state: IndexState) -> list[Path]:
        """Files no state at or before ``state`` names: writes whose transaction did not
        commit (any file past the version; a base made by a compaction that lost its
        race or died), and temporary files. Remove them only under the row lock."""
        folder = self.root / key
        found = [entry for entry in folder.glob(".*.tmp")] if folder.is_dir() else []
        for entry, version, suffix in self._entries(key):
            if version > state.version or (
                suffix != "delta" and state.base < version <= state.version
            ):
                found.append(entry)
        return sorted(found)

    def _entries(self, key: str) -> list[tuple[Path, int, str]]:
        folder = self.root / key
        if not folder.is_dir():
            return []
        entries = []
        for entry in folder.iterdir():
            match = _ENTRY.match(entry.name)
            if match:
                entries.append((entry, int(match.group(1)), match.group(2)))
        return entries

    def drop(self, key: str) -> None:
        self.forget(key)
        folder = self.root / key
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)


def remove_entry(entry: Path) -> None:
    """Delete a segment file or folder."""
    _remove(entry)


def _remove(entry: Path) -> None:
    if entry.is_dir():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)
