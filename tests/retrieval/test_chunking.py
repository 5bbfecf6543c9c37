import itertools
from collections.abc import Callable

import pytest

from retrieval import Block, DocumentTooLarge, FakeEmbedder, ParsedDocument, chunk_document
from retrieval.chunking import MAX_CHARS_PER_TOKEN
from retrieval.parsing import MARKDOWN, parse_document

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


def test_a_normal_document_chunks_as_before() -> None:
    # Produced by the chunker before it was made linear; ordinary text must not move.
    text = (
        "# Handbook\n\nWelcome to the team. Read this first.\n\n"
        "## Leave\n\nYou get 25 days a year. Ask your manager two weeks ahead; "
        "they answer within a day. Unused days roll over once.\n\n"
        "Public holidays are extra.\n\n"
        "### Sick leave\n\nTell us by 10:00. A note is needed after three days.\n\n"
        "## Expenses\n\nKeep receipts. Claims over 500 EUR need approval first."
    )
    doc = parse_document(text.encode(), media_type=MARKDOWN, title="")
    chunks = chunk_document(doc, count_tokens=count, max_tokens=24, overlap_tokens=6)
    assert [(c.headings, c.text, c.token_count) for c in chunks] == [
        ((), "Welcome to the team. Read this first.", 10),
        (
            ("Leave",),
            "You get 25 days a year. Ask your manager two weeks ahead; they answer within a day.",
            23,
        ),
        (
            ("Leave",),
            "they answer within a day. Unused days roll over once.\n\nPublic holidays are extra.",
            20,
        ),
        (("Leave", "Sick leave"), "Tell us by 10:00. A note is needed after three days.", 21),
        (("Expenses",), "Keep receipts. Claims over 500 EUR need approval first.", 14),
    ]


def counting(counter: Callable[[str], int]) -> tuple[Callable[[str], int], list[int]]:
    """``counter``, and a list that adds up the characters it was asked to count."""
    counted = [0]

    def count_tokens(text: str) -> int:
        counted[0] += len(text)
        return counter(text)

    return count_tokens, counted


def by_tens(text: str) -> int:  # a tokenizer where a long word costs a token per 10 chars
    return sum(max(1, len(w) // 10) for w in text.split())


def test_a_1_mib_word_is_cut_reading_each_character_a_few_times() -> None:
    blob = "x" * 2**20
    count_tokens, counted = counting(by_tens)
    chunks = chunk_document(
        ParsedDocument("", [Block(blob)]), count_tokens=count_tokens, max_tokens=50
    )
    assert "".join(c.text for c in chunks) == blob
    assert all(by_tens(c.text) <= 50 for c in chunks)
    # Re-counting the rest of the word after each cut read it 1,000 times over.
    assert counted[0] <= 8 * len(blob)


def test_a_word_of_one_token_per_character_is_cut_linearly() -> None:
    blob = "." * 200_000  # 200,000 tokens to the fake (and to BERT's) tokenizer
    count_tokens, counted = counting(count)
    chunks = chunk_document(
        ParsedDocument("T", [Block(blob)]), count_tokens=count_tokens, max_tokens=64
    )
    assert "".join(c.text for c in chunks) == blob
    assert all(c.token_count <= 64 for c in chunks)
    assert counted[0] <= 8 * len(blob)


def test_a_word_the_tokenizer_reads_as_one_token_still_makes_bounded_chunks() -> None:
    # BERT reads any word over 100 characters as one [UNK]: a 1 MiB word "fits" one chunk.
    blob = "a" * 2**20
    chunks = chunk_document(ParsedDocument("", [Block(blob)]), count_tokens=count, max_tokens=50)
    assert "".join(c.text for c in chunks) == blob
    assert max(len(c.text) for c in chunks) <= 50 * MAX_CHARS_PER_TOKEN


def test_a_word_of_uneven_density_is_cut_within_the_budget() -> None:
    # The piece length is estimated from the whole word; dense stretches must still fit.
    blob = ("a" * 3000 + "." * 300) * 20
    doc = ParsedDocument("", [Block(blob)])
    chunks = chunk_document(doc, count_tokens=count, max_tokens=40, overlap_tokens=0)
    assert "".join(c.text for c in chunks) == blob
    assert all(c.token_count <= 40 for c in chunks)


def test_long_words_among_ordinary_ones_lose_nothing() -> None:
    text = "start " + "y" * 5000 + " middle " + "z." * 2000 + " end."
    chunks = chunk_document(ParsedDocument("", [Block(text)]), count_tokens=count, max_tokens=40)
    assert all(c.token_count <= 40 for c in chunks)
    assert "".join(" ".join(c.text for c in chunks).split()) == "".join(text.split())
