"""Each server's usage convention read into one: cached within prompt, reasoning within
completion, nothing counted twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inference import UpstreamUsage
from inference.dialects import usage_from

WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire"

CASES: list[tuple[str, dict[str, Any], UpstreamUsage]] = [
    (
        "openai with details",
        {
            "prompt_tokens": 75,
            "completion_tokens": 1186,
            "prompt_tokens_details": {"cached_tokens": 64},
            "completion_tokens_details": {"reasoning_tokens": 1024},
        },
        UpstreamUsage(75, 1186, cached_tokens=64, reasoning_tokens=1024),
    ),
    (
        "llama.cpp / ollama, no details",
        {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        UpstreamUsage(12, 5, cached_tokens=0, reasoning_tokens=None),
    ),
    (
        "google thoughts beside the candidates",
        {
            "prompt_tokens": 40,
            "completion_tokens": 10,
            "thoughts_token_count": 30,
            "cached_content_token_count": 32,
        },
        UpstreamUsage(40, 40, cached_tokens=32, reasoning_tokens=30),
    ),
    (
        "anthropic cache apart from input, thinking inside output",
        {
            "input_tokens": 20,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 8,
            "output_tokens": 50,
        },
        UpstreamUsage(128, 50, cached_tokens=100, reasoning_tokens=None),
    ),
    (
        "a server that claims more reasoning than output",
        {
            "prompt_tokens": 5,
            "completion_tokens": 3,
            "completion_tokens_details": {"reasoning_tokens": 9},
        },
        UpstreamUsage(5, 3, cached_tokens=0, reasoning_tokens=3),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("what", "raw", "expected"), CASES)
def test_one_convention(what: str, raw: dict[str, Any], expected: UpstreamUsage) -> None:
    usage = usage_from(raw)
    assert usage == expected, what
    assert usage.cached_tokens <= usage.prompt_tokens
    assert (usage.reasoning_tokens or 0) <= usage.completion_tokens


def test_the_vllm_usage_chunk_reads_as_is() -> None:
    lines = (WIRE / "vllm-0.30" / "chat_stream_usage.sse").read_text().splitlines()
    chunks = [json.loads(line[5:]) for line in lines if line.startswith("data: {")]
    (usage,) = [usage_from(c["usage"]) for c in chunks if c.get("usage")]
    raw = next(c["usage"] for c in chunks if c.get("usage"))
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        raw["prompt_tokens"],
        raw["completion_tokens"],
    )


def test_no_usage_block() -> None:
    assert usage_from(None) is None
    assert usage_from({"total_tokens": 3}) is None
