"""Base + deltas minus tombstones search exactly as one index rebuilt from the live chunks."""

from collections.abc import Sequence
from pathlib import Path

import bm25s
import numpy as np
import pytest

from retrieval import (
    BM25Parameters,
    IndexCorrupted,
    IndexState,
    IndexStore,
    KeywordIndex,
    Segment,
    SegmentedIndex,
    VectorIndex,
)
from retrieval.analysis import LANGUAGE, stemmer

DIM = 384
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "sigma",
    "omega",
    "fan",
    "shoe",
    "soup",
    "order",
    "code",
    "runner",
    "running",
    "ship",
    "crack",
    "sole",
    "kilometre",
    "replacement",
    "cafeteria",
]


def vectors(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    matrix = rng.standard_normal((n, DIM)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def texts(ids: np.ndarray) -> list[str]:
    """A deterministic text per id, so a chunk reads the same in every segment."""
    out = []
    for chunk_id in ids:
        rng = np.random.default_rng(int(chunk_id))
        out.append(" ".join(rng.choice(WORDS, size=int(rng.integers(3, 20)))))
    return out


CORPUS = {int(i): v for i, v in zip(range(1000, 1300), vectors(300, 1), strict=True)}


def segment(add: list[int], tombstones: list[int] = ()) -> Segment:  # type: ignore[assignment]
    ids = np.array(add, dtype=np.int64)
    held = np.array([CORPUS[i] for i in add], dtype=np.float32).reshape(-1, DIM)
    return Segment(
        VectorIndex.build(DIM, "flat", ids=ids, vectors=held),
        KeywordIndex.build(ids, texts(ids)),
        np.array(tombstones, dtype=np.int64),
    )


def history() -> tuple[list[Segment], list[int]]:
    """A base, then adds, a delete, a re-delivered add (tombstones then re-adds the same
    ids) and a document replaced; returns the segments and the ids live at the end."""
    segments = [
        segment(list(range(1000, 1200))),
        segment(list(range(1200, 1210))),
        segment([], tombstones=list(range(1100, 1130))),  # a document deleted
        segment(list(range(1210, 1220))),
        segment(list(range(1210, 1220)), tombstones=list(range(1210, 1220))),  # re-delivered
        segment(list(range(1220, 1240)), tombstones=[1005, 1201, 1239]),
    ]
    live = sorted(set(range(1000, 1240)) - set(range(1100, 1130)) - {1005, 1201})
    return segments, live


def rebuilt(live: list[int]) -> SegmentedIndex:
    return SegmentedIndex([segment(live)])


def test_search_over_segments_equals_a_full_rebuild() -> None:
    segments, live = history()
    view, full = SegmentedIndex(segments), rebuilt(live)
    assert sorted(view.ids()) == live and len(view) == len(live)
    assert view.tombstone_ratio == pytest.approx(1 - len(live) / 250)
    queries = vectors(20, 7)
    assert view.search(queries, 10) == full.search(queries, 10)
    allowed = np.array([1001, 1005, 1110, 1150, 1215, 1239, 1230, 4242], dtype=np.int64)
    assert view.search(queries, 5, allowed=allowed) == full.search(queries, 5, allowed=allowed)
    found = {hit.id for row in view.search(queries, 5, allowed=allowed) for hit in row}
    assert found <= {1001, 1150, 1215, 1230, 1239}  # dead and unknown ids never come back
    for query in ("alpha omega", "running shoe sole", "fan fan code", "nothing-here"):
        assert view.keyword_search(query, 10) == full.keyword_search(query, 10)
        assert view.keyword_search(query, 3, allowed=allowed) == full.keyword_search(
            query, 3, allowed=allowed
        )


@pytest.mark.parametrize(("k1", "b"), [(0.9, 0.4), (2.0, 1.0), (1.2, 0.0)])
def test_any_bm25_parameters_rank_segments_as_a_full_rebuild(k1: float, b: float) -> None:
    segments, live = history()
    view, full = SegmentedIndex(segments), rebuilt(live)
    parameters = BM25Parameters(k1=k1, b=b)
    for query in ("alpha omega", "running shoe sole", "fan fan code"):
        tuned = view.keyword_search(query, 10, parameters=parameters)
        assert tuned == full.keyword_search(query, 10, parameters=parameters)
        assert tuned == full.segments[0].keywords.search(query, 10, parameters=parameters)
        assert view.keyword_search(query, 10) == full.keyword_search(query, 10)  # own cache


def test_compaction_equals_a_full_rebuild_and_merges_keywords() -> None:
    segments, live = history()
    compacted = SegmentedIndex([SegmentedIndex(segments).compact(policy="flat")])
    full = rebuilt(live)
    assert sorted(compacted.ids()) == live
    queries = vectors(10, 9)
    assert compacted.search(queries, 10) == full.search(queries, 10)
    for query in ("alpha omega", "running shoe sole", "lambda"):
        assert compacted.keyword_search(query, 20) == full.keyword_search(query, 20)


def test_keyword_scores_rank_as_bm25s_does() -> None:
    ids = np.arange(200, dtype=np.int64)
    corpus = texts(ids + 5000)
    ours = KeywordIndex.build(ids, corpus)
    reference = bm25s.BM25(method="lucene")
    reference.index(
        bm25s.tokenize(corpus, stopwords=LANGUAGE, stemmer=stemmer(), show_progress=False),
        show_progress=False,
    )
    for query in ("alpha omega", "running shoe", "kappa kappa sigma"):
        tokens = bm25s.tokenize(
            [query], stopwords=LANGUAGE, stemmer=stemmer(), return_ids=False, show_progress=False
        )[0]
        expected = np.asarray(reference.get_scores(tokens), dtype=np.float64)
        hits = ours.search(query, 200)
        got = np.zeros(len(ids))
        for hit in hits:
            got[hit.id] = hit.score
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_store_reads_live_segments_and_lists_orphans(tmp_path: Path) -> None:
    store = IndexStore(tmp_path, dimension=DIM)
    segments, live = history()
    store.write_base("7", 1, segments[0])
    for version, delta in enumerate(segments[1:], start=2):
        store.write_delta("7", version, delta)
    state = IndexState(base=1, version=6)
    assert sorted(store.load("7", state).ids()) == live
    assert store.load("7", state) is store.load("7", state)
    assert store.orphans("7", state) == []
    # A write that crashed before its commit: a delta past the version; searches ignore it.
    store.write_delta("7", 7, segment([1299]))
    assert 1299 not in store.load("7", state).ids()
    assert store.orphans("7", state) == [store.delta_path("7", 7)]
    # A compaction to version 6 whose commit never came: a base inside the live range.
    store.write_base("7", 6, SegmentedIndex(segments).compact(policy="flat"))
    assert store.orphans("7", state) == sorted(
        [store.path("7", 6), store.keyword_path("7", 6), store.delta_path("7", 7)]
    )
    compacted = IndexState(base=6, version=6)
    assert sorted(store.load("7", compacted).ids()) == live
    store.prune("7", base_before=1)  # one state behind stays for in-flight searches
    assert store.path("7", 1).exists() and store.delta_path("7", 2).exists()
    store.prune("7", base_before=6)
    assert not store.path("7", 1).exists() and not store.delta_path("7", 6).exists()
    with pytest.raises(IndexCorrupted, match="missing"):
        store.read("7", "delta", 3)


def test_cache_is_bounded_in_bytes_and_evicts_least_recently_used(tmp_path: Path) -> None:
    one = segment(list(range(1000, 1100)))
    store = IndexStore(tmp_path, dimension=DIM, cache_bytes=int(2.5 * one.nbytes))
    for key in ("a", "b", "c"):
        store.write_base(key, 1, segment(list(range(1000, 1100))))
    state = IndexState(base=1, version=1)
    store.load("a", state)
    store.load("b", state)
    store.load("a", state)  # a is now the most recently used
    store.load("c", state)  # over the bound: b goes
    assert [entry[0] for entry in store.cached()] == ["a", "c"]
    assert store.cached_bytes <= store.cache_bytes
    # A segment bigger than the whole bound is still served, alone.
    tiny = IndexStore(tmp_path, dimension=DIM, cache_bytes=1)
    assert len(tiny.load("a", state)) == 100 and len(tiny.cached()) == 1
    assert len(tiny.load("b", state)) == 100 and [e[0] for e in tiny.cached()] == ["b"]


def test_a_torn_delta_is_never_read(tmp_path: Path) -> None:
    store = IndexStore(tmp_path, dimension=DIM)
    store.write_delta("7", 2, segment([1000, 1001]))
    assert [p.name for p in (tmp_path / "7").iterdir()] == ["0000000002.delta"]
    (store.delta_path("7", 2) / "rows.npy").write_bytes(b"torn")
    with pytest.raises(IndexCorrupted):
        store.read("7", "delta", 2)


def test_compaction_patches_a_trained_ivf_and_retrains_it_on_growth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("retrieval.index.IVF_MIN_SIZE", 1000)
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((50, DIM)).astype(np.float32)

    def part(first: int, count: int, tombstones: Sequence[int] = ()) -> Segment:
        points = centres[rng.integers(0, 50, count)] + 0.6 * rng.standard_normal((count, DIM))
        points = (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)
        ids = np.arange(first, first + count, dtype=np.int64)
        kind = "ivf" if first == 0 else "flat"
        return Segment(
            VectorIndex.build(DIM, kind, ids=ids, vectors=points),  # type: ignore[arg-type]
            KeywordIndex.build(ids, ["word"] * count),
            np.array(tombstones, dtype=np.int64),
        )

    base = part(0, 4000)
    lists = base.vectors.lists
    patched = SegmentedIndex([base, part(4000, 100, tombstones=range(0, 50))]).compact(policy="ivf")
    assert patched.vectors.kind == "ivf" and patched.vectors.lists == lists  # not retrained
    assert sorted(patched.vectors.ids()) == list(range(50, 4100))
    grown = SegmentedIndex([patched, part(4100, 16_000)]).compact(policy="ivf")
    assert grown.vectors.lists >= 2 * lists  # 5x the vectors: trained again
    assert len(grown.vectors) == len(grown.keywords) == 20_050
