"""The approximate kinds keep recall@10 >= 0.95 against exact search, behind one contract."""

from pathlib import Path

import numpy as np
import pytest

from retrieval import Hit, VectorIndex, kind_for_size
from retrieval.index import AUTO_HNSW_FROM, AUTO_IVF_FROM, IVF_MIN_SIZE

DIM = 384
SIZE = 20_000


def clustered(n: int, *, seed: int, centres: int = 500) -> np.ndarray:
    """Unit vectors around random centres: embeddings of a corpus cluster by topic, and
    uniform noise would be the one case no index (nor any real data) looks like."""
    rng = np.random.default_rng(seed)
    middle = rng.standard_normal((centres, DIM)).astype(np.float32)
    points = middle[rng.integers(0, centres, n)] + 0.6 * rng.standard_normal((n, DIM)).astype(
        np.float32
    )
    return points / np.linalg.norm(points, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray, np.ndarray, list[set[int]]]:
    points = clustered(SIZE + 200, seed=1)  # queries about the same topics as the chunks
    vectors, queries = points[:SIZE], points[SIZE:]
    ids = np.arange(SIZE, dtype=np.int64) * 3 + 7  # chunk ids are not positions
    exact = VectorIndex.build(DIM, "flat", ids=ids, vectors=vectors).search(queries, 10)
    return vectors, ids, queries, [{hit.id for hit in row} for row in exact]


def recall(found: list[list[Hit]], truth: list[set[int]]) -> float:
    overlaps = [len({hit.id for hit in row} & want) for row, want in zip(found, truth, strict=True)]
    return float(np.mean(overlaps)) / 10


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_recall_at_10_against_flat(kind: str, data, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    vectors, ids, queries, truth = data
    index = VectorIndex.build(DIM, kind, ids=ids, vectors=vectors)  # type: ignore[arg-type]
    assert index.kind == kind and len(index) == SIZE
    assert recall(index.search(queries, 10), truth) >= 0.95
    # The same contract: ids, filters inside the search, removal, files.
    assert sorted(index.ids()) == sorted(ids)
    allowed = ids[::50]
    filtered = index.search(queries[:20], 5, allowed=allowed)
    assert all(len(row) == 5 and {hit.id for hit in row} <= set(allowed) for row in filtered)
    dropped = [hit.id for hit in index.search(queries[:1], 3)[0]]
    assert index.remove(np.array(dropped)) == 3
    assert not set(dropped) & {hit.id for hit in index.search(queries[:1], 10)[0]}
    index.write(tmp_path / "index.faiss")
    loaded = VectorIndex.read(tmp_path / "index.faiss", dimension=DIM)
    assert loaded.kind == kind and len(loaded) == SIZE - 3
    assert loaded.search(queries[:5], 10) == index.search(queries[:5], 10)


def test_ivf_vectors_round_trip_exactly(data) -> None:  # type: ignore[no-untyped-def]
    vectors, ids, _, _ = data
    index = VectorIndex.build(DIM, "ivf", ids=ids[:5000], vectors=vectors[:5000])
    held_ids, held = index.vectors()
    order = np.argsort(held_ids)
    np.testing.assert_array_equal(held_ids[order], ids[:5000])
    np.testing.assert_array_equal(held[order], vectors[:5000])


def test_auto_switches_kind_by_size() -> None:
    assert kind_for_size("auto", 0) == "flat"
    assert kind_for_size("auto", AUTO_HNSW_FROM - 1) == "flat"
    assert kind_for_size("auto", AUTO_HNSW_FROM) == "hnsw"
    assert kind_for_size("auto", AUTO_IVF_FROM) == "ivf"
    assert kind_for_size("ivf", IVF_MIN_SIZE - 1) == "flat"  # too few points to train on
    assert kind_for_size("ivf", IVF_MIN_SIZE) == "ivf"
    assert kind_for_size("hnsw", 10) == "hnsw"
