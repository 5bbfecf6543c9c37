from pathlib import Path

import numpy as np
import pytest

from retrieval import FakeEmbedder, IndexCorrupted, VectorIndex

DIM = 384


def vectors(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    matrix = rng.standard_normal((n, DIM)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_add_search_remove_by_chunk_id(kind: str) -> None:
    index = VectorIndex(DIM, kind)  # type: ignore[arg-type]
    data = vectors(50)
    ids = np.arange(1000, 1050, dtype=np.int64)
    index.add(ids, data)
    assert len(index) == 50
    best = index.search(data[7], 3)[0]
    assert best[0].id == 1007
    assert best[0].score == pytest.approx(1.0, abs=1e-5)
    assert index.remove(np.array([1007, 1008, 99999])) == 2
    assert len(index) == 48
    assert 1007 not in {hit.id for hit in index.search(data[7], 10)[0]}
    assert sorted(index.ids()) == sorted(set(ids) - {1007, 1008})


def test_search_on_empty_index_and_k_larger_than_size() -> None:
    index = VectorIndex(DIM)
    assert index.search(vectors(1), 5) == [[]]
    index.add(np.array([1, 2]), vectors(2))
    assert len(index.search(vectors(1), 10)[0]) == 2


def test_write_is_atomic_and_round_trips(tmp_path: Path) -> None:
    index = VectorIndex(DIM, "hnsw")
    index.add(np.array([5, 6]), vectors(2))
    path = tmp_path / "c" / "0000000001.faiss"
    index.write(path)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
    loaded = VectorIndex.read(path, dimension=DIM)
    assert loaded.kind == "hnsw"
    assert sorted(loaded.ids()) == [5, 6]
    with pytest.raises(IndexCorrupted):
        VectorIndex.read(path, dimension=128)
    path.write_bytes(b"not an index")
    with pytest.raises(IndexCorrupted):
        VectorIndex.read(path, dimension=DIM)


def test_fake_embedder_is_deterministic_normalised_and_lexical() -> None:
    embedder = FakeEmbedder()
    a = embedder.embed(["the cat sat", "the cat sat", "quantum chromodynamics"])
    assert a.vectors.shape == (3, DIM)
    assert a.token_count == 3 * 2 + 3 + 3 + 2
    np.testing.assert_allclose(np.linalg.norm(a.vectors, axis=1), 1.0, rtol=1e-6)
    assert float(a.vectors[0] @ a.vectors[1]) == pytest.approx(1.0)
    assert float(a.vectors[0] @ a.vectors[2]) < 0.5


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_a_filter_applies_inside_the_search_not_after_the_top_k(kind: str) -> None:
    index = VectorIndex(DIM, kind)  # type: ignore[arg-type]
    data = vectors(200)
    index.add(np.arange(1, 201, dtype=np.int64), data)
    query = data[0]
    ranked = [hit.id for hit in index.search(query, 200)[0]]
    far = ranked[-3:]  # the three least similar: an unfiltered top 3 never holds them
    found = index.search(query, 3, allowed=np.array([*far, 99999]))[0]
    assert sorted(hit.id for hit in found) == sorted(far)
    assert [hit.id for hit in found] == [i for i in ranked if i in far]
    assert index.search(query, 3, allowed=np.array([], dtype=np.int64)) == [[]]
