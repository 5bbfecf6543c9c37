"""The model registry: parsing and checking INFERENCE_MODELS, fallback chains, upstream
capacity, tokenizer specs and rendezvous ordering."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from inference import FakeTokenizer, RegistryError, registry_parse, rendezvous_order
from inference.registry import (
    FAKE_TOKENIZER,
    GGUF_TOKENIZER,
    HF_TOKENIZER,
    REMOTE_TOKENIZER,
    TIKTOKEN_TOKENIZER,
    Price,
    tokenizer_spec,
)

RAW: dict[str, Any] = {
    "small": {
        "upstreams": ["http://a:8000/v1/", "http://b:8000/v1"],
        "model": "qwen-small",
        "tokenizer": "fake",
        "max_concurrency": 8,
        "fallback": "large",
        "price": {"input": 0.1, "output": 0.4},
        "energy": 0.2,
    },
    "large": {
        "upstreams": ["http://b:8000/v1", "http://c:8000/v1"],
        "model": "qwen-large",
        "tokenizer": "remote",
        "context_window": 32768,
        "max_output_tokens": 4096,
        "max_concurrency": 4,
        "api_key": "secret",
        "fallback": "small",
    },
}


def test_a_registry_is_parsed_into_typed_entries() -> None:
    registry = registry_parse(RAW)
    small, large = registry.entries["small"], registry.entries["large"]
    assert small.upstreams == ("http://a:8000/v1", "http://b:8000/v1")  # trailing / dropped
    assert (small.model, small.context_window, small.max_output_tokens) == ("qwen-small", None, 512)
    assert small.price == Price(input=0.1, output=0.4) and small.price.cached == 0.1
    assert small.energy == 0.2
    assert small.tokenizer.backend == FAKE_TOKENIZER
    assert isinstance(small.tokenizer.load(), FakeTokenizer)
    assert large.tokenizer.backend == REMOTE_TOKENIZER
    assert dict(large.tokenizer.options) == {"base_url": "http://b:8000/v1", "model": "qwen-large"}
    assert (large.context_window, large.max_output_tokens, large.api_key) == (32768, 4096, "secret")
    assert "secret" not in repr(large)


def test_fallback_chains_stop_at_a_cycle_and_shared_upstreams_take_the_smallest_limit() -> None:
    registry = registry_parse(RAW)
    assert [e.alias for e in registry.chain("small")] == ["small", "large"]
    assert [e.alias for e in registry.chain("large")] == ["large", "small"]
    assert registry.upstreams() == {
        "http://a:8000/v1": 8,
        "http://b:8000/v1": 4,
        "http://c:8000/v1": 4,
    }


@pytest.mark.parametrize(
    ("spec", "backend", "options"),
    [
        ("gguf", GGUF_TOKENIZER, {"path": None}),
        ("gguf:/models/x.gguf", GGUF_TOKENIZER, {"path": "/models/x.gguf"}),
        ("hf:/models/qwen", HF_TOKENIZER, {"path": "/models/qwen"}),
        ("remote", REMOTE_TOKENIZER, {"base_url": "http://u/v1", "model": "m"}),
        ("fake", FAKE_TOKENIZER, {}),
        ("tiktoken:cl100k_base", TIKTOKEN_TOKENIZER, {"data_dir": None, "encoding": "cl100k_base"}),
        ("tiktoken:o200k_base", TIKTOKEN_TOKENIZER, {"data_dir": None, "encoding": "o200k_base"}),
    ],
)
def test_tokenizer_specs(spec: str, backend: str, options: dict[str, Any]) -> None:
    parsed = tokenizer_spec(spec, upstream="http://u/v1", model="m")
    assert (parsed.backend, dict(parsed.options)) == (backend, options)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"upstreams": []}, "small.upstreams"),
        ({"upstreams": ["vllm:8000"]}, "small.upstreams"),
        ({"model": ""}, "small.model"),
        ({"tokenizer": "tiktoken:p50k_base"}, "tokenizer 'tiktoken:p50k_base'"),
        ({"tokenizer": "tiktoken"}, "'tiktoken:cl100k_base', 'tiktoken:o200k_base'"),
        ({"tokenizer": "hf:"}, "tokenizer 'hf:'"),
        ({"fallback": "huge"}, "names 'huge'"),
        ({"fallback": "small"}, "small.fallback"),
        ({"max_concurrency": 0}, "small.max_concurrency"),
        ({"context_window": "8k"}, "small.context_window"),
        ({"price": {"input": -1}}, "small.price.input"),
        ({"price": {"per_token": 1}}, "small.price"),
        ({"colour": "red"}, "unknown fields ['colour']"),
        ({"server": "sglang"}, "small.server"),
        ({"unsupported": "logprobs"}, "small.unsupported: a list"),
        ({"unsupported": ["colour"]}, "small.unsupported: not request fields: ['colour']"),
    ],
)
def test_a_wrong_field_is_named(change: dict[str, Any], message: str) -> None:
    raw = {**RAW, "small": {**RAW["small"], **change}}
    with pytest.raises(RegistryError, match=message.replace("[", r"\[").replace("(", r"\(")):
        registry_parse(raw)


def test_only_vllm_takes_a_cache_salt() -> None:
    servers = {"small": "vllm", "large": "llama.cpp"}
    registry = registry_parse(
        {alias: {**fields, "server": servers[alias]} for alias, fields in RAW.items()}
    )
    assert registry.entries["small"].takes_cache_salt
    assert not registry.entries["large"].takes_cache_salt
    assert registry_parse(RAW).entries["small"].server == "other"  # unsaid: no salt
    assert not registry_parse(RAW).entries["small"].takes_cache_salt


def test_auto_is_reserved_and_the_default_must_exist() -> None:
    with pytest.raises(RegistryError, match="reserved"):
        registry_parse({**RAW, "auto": RAW["small"]})
    with pytest.raises(RegistryError, match="default alias 'medium'"):
        registry_parse(RAW, default="medium")
    with pytest.raises(RegistryError, match="JSON object"):
        registry_parse({})


def test_rendezvous_keeps_a_key_on_its_upstream_and_moves_only_the_removed_ones_keys() -> None:
    upstreams = ["http://a/v1", "http://b/v1", "http://c/v1"]
    keys = [f"conversation:{n}" for n in range(600)]
    first = {key: rendezvous_order(key, upstreams)[0] for key in keys}
    assert first == {key: rendezvous_order(key, list(reversed(upstreams)))[0] for key in keys}
    shares = Counter(first.values())
    assert all(150 < shares[u] < 250 for u in upstreams), shares  # spread evenly
    without_b = {key: rendezvous_order(key, ["http://a/v1", "http://c/v1"])[0] for key in keys}
    moved = {key for key in keys if without_b[key] != first[key]}
    assert moved == {key for key in keys if first[key] == "http://b/v1"}
    # The second choice is where a key goes when its first is down: the same order.
    assert all(rendezvous_order(key, upstreams)[1] == without_b[key] for key in moved)


def test_an_entry_names_the_fields_its_upstreams_cannot_honour() -> None:
    raw = {**RAW, "small": {**RAW["small"], "unsupported": ["logprobs", "tools"]}}
    assert registry_parse(raw).entries["small"].unsupported == {"logprobs", "tools"}
