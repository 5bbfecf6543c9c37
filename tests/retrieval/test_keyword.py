from pathlib import Path

import numpy as np
import pytest

from retrieval import BM25Parameters as BM25
from retrieval import IndexCorrupted, KeywordIndex, KeywordQuery, keyword_query, keyword_tokens
from retrieval.bm25 import _Part

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


def test_each_distinct_query_term_is_looked_up_once_and_weighs_as_often_as_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A word pasted ten thousand times is one pass over its postings, not ten thousand;
    the ranking and scores are what bm25s gives (each use summed)."""
    index = KeywordIndex.build(IDS, TEXTS)
    looked_up: list[str] = []
    postings = _Part.postings

    def counted(part: _Part, token: str) -> object:
        looked_up.append(token)
        return postings(part, token)

    monkeypatch.setattr(_Part, "postings", counted)
    repeated = index.search("running " * 10_000, 5)
    assert looked_up == ["run"]
    once = index.search("running", 5)
    assert [hit.id for hit in repeated] == [hit.id for hit in once] == [30]
    for many, one in zip(repeated, once, strict=True):
        assert many.score == pytest.approx(10_000 * one.score, rel=1e-5)


def test_a_long_query_is_tokenized_only_until_it_has_its_terms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A question pasted at many times the context window: past the cap, the rest of it
    is never tokenized; below the cap, a query is read whole, a slice at a time, words
    never split."""
    from retrieval import analysis

    read: list[int] = []
    tokens = analysis.keyword_tokens

    def counted(texts: list[str]) -> list[list[str]]:
        read.append(sum(len(text) for text in texts))
        return tokens(texts)

    monkeypatch.setattr(analysis, "keyword_tokens", counted)
    words = [f"term{i}x" for i in range(100_000)]
    text = " ".join(words)  # 100,000 distinct words, about 900,000 characters
    query = keyword_query(text, max_terms=64)
    assert query.terms == tuple(tokens([" ".join(words[:64])])[0])
    assert sum(read) <= analysis.QUERY_SLICE_CHARS
    read.clear()
    whole = keyword_query(" ".join(words[:2000]), max_terms=None)
    assert len(whole.terms) == 2000  # no word cut in two at a slice's end
    assert len(read) > 1 and sum(read) == len(" ".join(words[:2000]))  # all of it, once


def test_a_query_keeps_its_first_distinct_terms_up_to_the_cap() -> None:
    query = keyword_query("soup running soups shoes cafeteria", max_terms=2)
    assert query == KeywordQuery(terms=("soup", "run"), counts=(2, 1))
    assert keyword_query("the and of") == KeywordQuery(terms=(), counts=())
    index = KeywordIndex.build(IDS, TEXTS)
    assert index.search(query, 5) == index.search("soup soup running", 5)
    assert index.search(keyword_query("cafeteria shoes", max_terms=1), 5) == index.search(
        "cafeteria", 5
    )


def test_bm25_b_weighs_chunk_length_and_k1_saturates_repeats() -> None:
    index = KeywordIndex.build(
        [1, 2, 3],
        ["apple", "apple banana cherry grape melon", "apple apple apple banana cherry"],
    )
    default = {hit.id: hit.score for hit in index.search("apple", 3)}
    assert default[1] > default[2]  # the shorter chunk, under b = 0.75
    no_length = {hit.id: hit.score for hit in index.search("apple", 3, parameters=BM25(b=0.0))}
    assert no_length[1] == pytest.approx(no_length[2])  # same tf, length ignored
    assert no_length[3] > no_length[1]  # three uses beat one
    no_tf = {hit.id: hit.score for hit in index.search("apple", 3, parameters=BM25(k1=0.0))}
    assert no_tf[1] == pytest.approx(no_tf[2]) == pytest.approx(no_tf[3])  # presence only
    assert index.search("apple", 3, parameters=BM25()) == index.search("apple", 3)


@pytest.mark.parametrize(("k1", "b"), [(-0.1, 0.75), (1.2, 1.5), (1.2, -0.1)])
def test_bm25_parameters_out_of_range_are_refused(k1: float, b: float) -> None:
    with pytest.raises(ValueError, match="BM25"):
        BM25(k1=k1, b=b)
