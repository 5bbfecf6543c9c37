"""Log probabilities read from each server's stream into OpenAI's shape, kept with the
answer text they describe when reads are merged."""

from __future__ import annotations

import json
from typing import Any

from inference import ReasoningDelta, TextDelta
from inference.reasoning import ThinkSplitter
from inference.stream import coalesced, parse_lines, token_logprobs


def _line(content: str, logprobs: Any) -> str:
    choice = {"index": 0, "delta": {"content": content}, "logprobs": logprobs}
    return "data: " + json.dumps({"choices": [choice]})


def test_vllms_entries_are_kept_as_they_are() -> None:
    entry = {
        "token": "Hi",
        "logprob": -0.5,
        "bytes": [72, 105],
        "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}],
    }
    events: list[Any] = []
    parse_lines([_line("Hi", {"content": [entry]})], ThinkSplitter(), into=events)
    assert events == [TextDelta("Hi", (entry,))]


def test_tgi_and_llama_cpp_python_entries_get_their_bytes() -> None:
    tgi = {"token": "é", "logprob": -1, "top_logprobs": [{"token": "e", "logprob": -2}]}
    llama = {"token": "x", "logprob": -0.1, "bytes": None, "top_logprobs": []}
    entries = token_logprobs({"content": [tgi, llama]})
    assert entries[0] == {
        "token": "é",
        "logprob": -1.0,
        "bytes": list("é".encode()),
        "top_logprobs": [{"token": "e", "logprob": -2.0, "bytes": [101]}],
    }
    assert entries[1]["bytes"] == [120]


def test_malformed_entries_are_left_out_and_minus_infinity_is_clamped() -> None:
    raw = {"content": [{"token": 1}, "x", {"token": "a", "logprob": "low"}, None]}
    assert token_logprobs(raw) == ()
    for low in (-1e6, float("-inf"), float("nan")):
        entry = token_logprobs({"content": [{"token": "a", "logprob": low}]})[0]
        assert entry["logprob"] == -9999.0
    assert token_logprobs(None) == () and token_logprobs({"content": "x"}) == ()


def test_merged_reads_keep_every_tokens_entry_in_order() -> None:
    a, b = {"token": "a"}, {"token": "b"}
    merged = coalesced([TextDelta("a", (a,)), TextDelta("b", (b,)), ReasoningDelta("r")])
    assert merged == [TextDelta("ab", (a, b)), ReasoningDelta("r")]


def test_reasoning_tokens_carry_none_and_a_chunk_without_text_keeps_its_entries() -> None:
    entry = {"token": "t", "logprob": -0.1, "bytes": [116], "top_logprobs": []}
    events: list[Any] = []
    splitter = ThinkSplitter()
    parse_lines([_line("<think>why", {"content": [entry]})], splitter, into=events)
    assert all(not isinstance(e, TextDelta) or not e.logprobs for e in events)
    events.clear()
    parse_lines([_line("", {"content": [entry]})], ThinkSplitter(), into=events)
    assert events == [TextDelta("", (entry,))]
