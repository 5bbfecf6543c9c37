import json
from pathlib import Path

import httpx
import pytest

from inference import FakeTokenizer, RemoteTokenizer, TokenizerUnavailable, load_tokenizer

WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire" / "vllm-0.30"


def test_remote_tokenizer_asks_vllms_tokenize_endpoint_with_the_template() -> None:
    seen: list[tuple[str, dict[str, object]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, content=(WIRE / "tokenize_response.json").read_bytes())

    tokenizer = RemoteTokenizer(
        base_url="http://vllm:8000/v1",
        model="Qwen/Qwen2.5-7B-Instruct",
        transport=httpx.MockTransport(handler),
    )
    assert tokenizer.count_chat([{"role": "user", "content": "Hello!"}]) == 31
    assert seen[0] == ("/tokenize", json.loads((WIRE / "tokenize_request.json").read_text()))
    tokenizer.count("plain")
    assert seen[1][1] == {
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "prompt": "plain",
        "add_special_tokens": False,
    }


def test_remote_tokenizer_wraps_transport_errors() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("down")

    tokenizer = RemoteTokenizer(
        base_url="http://vllm:8000/v1", model="m", transport=httpx.MockTransport(handler)
    )
    with pytest.raises(TokenizerUnavailable):
        tokenizer.count("x")


def test_load_tokenizer_by_dotted_path_is_cached_and_fails_clearly() -> None:
    first = load_tokenizer("inference.tokenizers.FakeTokenizer")
    assert isinstance(first, FakeTokenizer)
    assert load_tokenizer("inference.tokenizers.FakeTokenizer") is first
    with pytest.raises(TokenizerUnavailable, match="cannot be imported"):
        load_tokenizer("inference.tokenizers.Nope")
