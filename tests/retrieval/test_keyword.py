from pathlib import Path

import numpy as np
import pytest

from retrieval import IndexCorrupted, KeywordIndex, keyword_tokens

TEXTS = [
    "Replacement fans ship under the order code XQ-7781-B.",
    "The cafeteria serves soup on Fridays.",
    "Running shoes wear out after about 800 kilometres of running.",
    "A runner's shoe: replace it when the sole cracks.",
]
IDS = [10, 20, 30, 40]


def test_analysis_lowercases_drops_stop_words_and_stems() -> None:
    assert keyword_tokens(["The Runners are RUNNING to XQ-7781-B"]) == [
        ["runner", "run", "xq", "7781"]
    ]
    assert keyword_tokens([]) == []


def test_exact_rare_terms_and_stems_are_found_best_first() -> None:
    index = KeywordIndex.build(IDS, TEXTS)
    assert len(index) == 4
    assert [hit.id for hit in index.search("XQ-7781-B", 5)] == [10]
    found = index.search("run shoes", 5)
    assert {hit.id for hit in found} == {30, 40}
    assert found[0].score >= found[1].score > 0
    # Words in no chunk, or only stop words: nothing, rather than every chunk at zero.
    assert index.search("quantum chromodynamics", 5) == []
    assert index.search("the and of", 5) == []
    assert index.search("running", 0) == []


def test_allowed_masks_before_the_top_k() -> None:
    index = KeywordIndex.build(IDS, TEXTS)
    best = index.search("running shoes", 1)
    assert [hit.id for hit in best] == [30]
    allowed = np.array([40, 20], dtype=np.int64)
    assert [hit.id for hit in index.search("running shoes", 1, allowed=allowed)] == [40]
    assert index.search("running shoes", 5, allowed=np.array([20])) == []


def test_empty_index_searches_to_nothing_and_round_trips(tmp_path: Path) -> None:
    empty = KeywordIndex.build([], [])
    assert len(empty) == 0 and empty.search("anything", 3) == []
    empty.write(tmp_path / "0000000001.bm25")
    assert len(KeywordIndex.read(tmp_path / "0000000001.bm25")) == 0
    wordless = KeywordIndex.build([7, 8], ["a b c", "the and of"])  # no indexable word
    assert len(wordless) == 2 and wordless.search("a the", 3) == []
    wordless.write(tmp_path / "0000000002.bm25")
    assert sorted(KeywordIndex.read(tmp_path / "0000000002.bm25").ids()) == [7, 8]
    with pytest.raises(ValueError, match="2 ids for 1 texts"):
        KeywordIndex.build([1, 2], ["one"])


def test_write_is_atomic_replaces_a_rolled_back_version_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "c" / "0000000002.bm25"
    KeywordIndex.build([1], ["an orphan left by a rolled back write"]).write(path)
    index = KeywordIndex.build(IDS, TEXTS)
    index.write(path)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp folder left
    loaded = KeywordIndex.read(path)
    assert sorted(loaded.ids()) == IDS
    assert loaded.search("soup friday", 3) == index.search("soup friday", 3)
    (path / "ids.npy").write_bytes(b"not an array")
    with pytest.raises(IndexCorrupted):
        KeywordIndex.read(path)
    np.save(path / "ids.npy", np.array([1, 2], dtype=np.int64))
    with pytest.raises(IndexCorrupted, match="2 ids"):
        KeywordIndex.read(path)
