import itertools

import pytest

from retrieval import Block, DocumentTooLarge, FakeEmbedder, ParsedDocument, chunk_document

count = FakeEmbedder().count_tokens


def words(n: int, word: str = "w") -> str:
    return " ".join(f"{word}{i}" for i in range(n))


def test_short_paragraphs_share_a_chunk_within_a_section() -> None:
    doc = ParsedDocument("T", [Block("alpha beta."), Block("gamma delta.")])
    chunks = chunk_document(doc, count_tokens=count, max_tokens=50)
    assert [c.text for c in chunks] == ["alpha beta.\n\ngamma delta."]
    assert chunks[0].embedding_text == "T\nalpha beta.\n\ngamma delta."


def test_chunks_never_cross_a_heading_boundary() -> None:
    doc = ParsedDocument("T", [Block("one.", ("A",)), Block("two.", ("B",))])
    chunks = chunk_document(doc, count_tokens=count, max_tokens=50)
    assert [(c.headings, c.text) for c in chunks] == [(("A",), "one."), (("B",), "two.")]
    assert [c.index for c in chunks] == [0, 1]


def test_every_chunk_fits_the_budget_including_title_and_headings() -> None:
    paragraphs = [Block(words(37, f"p{i}w") + ".", ("Sec", "Sub")) for i in range(12)]
    doc = ParsedDocument("A title", paragraphs)
    chunks = chunk_document(doc, count_tokens=count, max_tokens=64, overlap_tokens=8)
    assert len(chunks) > 5
    for chunk in chunks:
        assert count(chunk.embedding_text) <= 64
        assert chunk.token_count == count(chunk.embedding_text)


def test_long_paragraph_splits_by_sentence_then_words_and_loses_nothing() -> None:
    sentences = [words(10, f"s{i}x") + "." for i in range(6)]
    giant = words(150, "g")  # one "sentence" longer than the budget
    doc = ParsedDocument("", [Block(" ".join(sentences) + " " + giant)])
    chunks = chunk_document(doc, count_tokens=count, max_tokens=40, overlap_tokens=0)
    joined = " ".join(c.text for c in chunks).split()
    assert joined == (" ".join(sentences) + " " + giant).split()
    assert all(count(c.text) <= 40 for c in chunks)


def test_overlap_repeats_the_tail_of_the_previous_chunk() -> None:
    sentences = " ".join(f"Sentence number {i} ends here." for i in range(20))
    doc = ParsedDocument("", [Block(sentences)])
    chunks = chunk_document(doc, count_tokens=count, max_tokens=30, overlap_tokens=8)
    assert len(chunks) >= 3
    for previous, current in itertools.pairwise(chunks):
        last_sentence = previous.text.split(". ")[-1]
        assert current.text.startswith(last_sentence.rstrip("."))


def test_a_single_huge_token_is_cut_by_characters() -> None:
    blob = "x" * 5000

    def chars(text: str) -> int:  # a tokenizer where long words cost many tokens
        return sum(max(1, len(w) // 10) for w in text.split())

    chunks = chunk_document(ParsedDocument("", [Block(blob)]), count_tokens=chars, max_tokens=50)
    assert "".join(c.text for c in chunks) == blob
    assert all(chars(c.text) <= 50 for c in chunks)


def test_chunk_limit_is_enforced_early() -> None:
    doc = ParsedDocument("", [Block(words(10), (str(i),)) for i in range(100)])
    with pytest.raises(DocumentTooLarge) as raised:
        chunk_document(doc, count_tokens=count, max_tokens=50, max_chunks=10)
    assert raised.value.code == "too_many_chunks"
