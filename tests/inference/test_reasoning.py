"""Thoughts split from the answer however the chunks fall, without ever hiding the answer."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference.reasoning import ThinkSplitter


def split(chunks: list[str], *, opened: bool = False) -> tuple[str, str]:
    splitter = ThinkSplitter(opened=opened)
    parts = [part for chunk in chunks for part in splitter.feed(chunk)] + splitter.flush()
    reasoning = "".join(text for kind, text in parts if kind == "reasoning")
    content = "".join(text for kind, text in parts if kind == "content")
    return reasoning, content


def every_split(text: str) -> list[list[str]]:
    return [[text[:i], text[i:]] for i in range(len(text) + 1)]


@pytest.mark.parametrize("chunks", every_split("  <think>weigh it</think>The answer."))
def test_a_leading_block_is_reasoning_wherever_the_chunks_split(chunks: list[str]) -> None:
    assert split(chunks) == ("weigh it", "The answer.")


@pytest.mark.parametrize("chunks", every_split("Use the <think> tag, then </think> ends it."))
def test_a_literal_think_tag_in_the_answer_hides_nothing(chunks: list[str]) -> None:
    reasoning, content = split(chunks)
    assert reasoning == ""
    assert content == "Use the <think> tag, then  ends it."


@pytest.mark.parametrize("chunks", every_split("weigh it</think>The answer."))
def test_r1_templates_open_the_block_in_the_prompt(chunks: list[str]) -> None:
    assert split(chunks, opened=True) == ("weigh it", "The answer.")


def test_a_lone_closing_tag_never_shows() -> None:
    assert split(["weigh it</think>The answer."]) == ("", "weigh itThe answer.")


def test_an_unclosed_block_stays_reasoning_and_plain_text_passes() -> None:
    assert split(["<think>still thinking"]) == ("still thinking", "")
    assert split(["Plain ", "answer <thi", "ng>"]) == ("", "Plain answer <thing>")


@given(
    text=st.text(alphabet="<>/think ab", max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=12),
    opened=st.booleans(),
)
def test_any_chunking_splits_as_the_whole_text_does(
    text: str, cuts: list[int], opened: bool
) -> None:
    bounds = sorted({0, len(text), *(min(cut, len(text)) for cut in cuts)})
    chunks = [text[start:end] for start, end in itertools.pairwise(bounds)]
    assert split(chunks, opened=opened) == split([text], opened=opened)


def test_token_by_token_the_tags_still_split() -> None:
    tokens = ["<", "think", ">", "weigh", " it", "<", "/", "think", ">", "The", " <", "b>", "."]
    assert split(tokens) == ("weigh it", "The <b>.")
