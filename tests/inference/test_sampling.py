"""Each server's dialect of the sampling fields: what goes on the wire, what is refused."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from inference import ChatRequest, OpenAIClient, Sampling, sampling_refused, sampling_wire

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
EVERYTHING = Sampling(
    temperature=0.0,
    top_p=0.5,
    stop=("\n\n", "END"),
    seed=7,
    presence_penalty=0.25,
    frequency_penalty=-0.5,
    logit_bias=(("15", -100.0),),
    response_format=JSON_SCHEMA,
    user="end-user-1",
)
OPENAI_WIRE = {
    "temperature": 0.0,
    "top_p": 0.5,
    "stop": ["\n\n", "END"],
    "seed": 7,
    "presence_penalty": 0.25,
    "frequency_penalty": -0.5,
    "logit_bias": {"15": -100.0},
    "response_format": JSON_SCHEMA,
    "user": "end-user-1",
}


def test_vllm_and_other_servers_take_openai_fields_as_they_are() -> None:
    for server in ("vllm", "other"):
        assert sampling_refused(server, EVERYTHING) is None
        assert sampling_wire(server, EVERYTHING) == OPENAI_WIRE


def test_llama_cpp_takes_a_json_schema_as_a_json_object_with_its_schema() -> None:
    assert sampling_refused("llama.cpp", EVERYTHING) is None
    wire = sampling_wire("llama.cpp", EVERYTHING)
    assert wire == {**OPENAI_WIRE, "response_format": {"type": "json_object", "schema": SCHEMA}}
    plain = Sampling(response_format={"type": "json_object"})
    assert sampling_wire("llama.cpp", plain) == {"response_format": {"type": "json_object"}}


def test_ollama_refuses_logit_bias_and_takes_the_rest_without_user() -> None:
    assert sampling_refused("ollama", EVERYTHING) == "logit_bias"
    honoured = Sampling(**{**EVERYTHING.fields(), "logit_bias": None})
    assert sampling_refused("ollama", honoured) is None
    wire = sampling_wire("ollama", honoured)
    assert wire == {k: v for k, v in OPENAI_WIRE.items() if k not in ("logit_bias", "user")}


def test_tgi_writes_json_as_its_grammar_and_leaves_out_a_top_p_of_one() -> None:
    assert sampling_refused("tgi", EVERYTHING) == "logit_bias"
    sampling = Sampling(top_p=1.0, temperature=0.3, response_format=JSON_SCHEMA)
    assert sampling_wire("tgi", sampling) == {
        "temperature": 0.3,
        "response_format": {"type": "json_object", "value": SCHEMA},
    }
    any_object = sampling_wire("tgi", Sampling(response_format={"type": "json_object"}))
    assert any_object == {"response_format": {"type": "json_object", "value": {"type": "object"}}}
    assert sampling_refused("tgi", Sampling(top_p=0.0)) == "top_p"


def test_triton_refuses_structured_output_but_not_a_text_format() -> None:
    assert sampling_refused("triton", Sampling(response_format=JSON_SCHEMA)) == "response_format"
    text = Sampling(temperature=0.5, response_format={"type": "text"})
    assert sampling_refused("triton", text) is None
    assert sampling_wire("triton", text) == {"temperature": 0.5}


def test_nothing_set_sends_nothing() -> None:
    for server in ("vllm", "llama.cpp", "ollama", "tgi", "triton", "other"):
        assert sampling_wire(server, Sampling()) == {}


@pytest.mark.parametrize(
    ("server", "expected"),
    [("vllm", {"seed": 1, "user": "u"}), ("ollama", {"seed": 1})],
)
async def test_the_client_sends_the_fields_in_the_requests_server_dialect(
    server: str, expected: dict[str, Any]
) -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(orjson.loads(request.content))
        return httpx.Response(
            200, content=b'data: {"choices":[{"delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n'
        )

    client = OpenAIClient(base_url="http://tier/v1", transport=httpx.MockTransport(handler))
    request = ChatRequest(
        model="m", messages=[], max_tokens=5, sampling=Sampling(seed=1, user="u"), server="vllm"
    )
    request = request.for_model(model="m", max_tokens=5, reasoning_opened=False, server=server)
    async for _ in client.stream_chat(request):
        pass
    await client.aclose()
    assert {k: v for k, v in sent[0].items() if k in ("seed", "user")} == expected


@pytest.mark.parametrize(
    ("server", "top"), [("llama.cpp", 0), ("vllm", None), ("tgi", None), ("ollama", None)]
)
def test_logprobs_go_to_every_server_but_triton(server: str, top: int | None) -> None:
    asked = Sampling(logprobs=True)
    assert sampling_refused(server, asked) is None
    assert sampling_wire(server, asked) == {
        "logprobs": True,
        **({} if top is None else {"top_logprobs": top}),
    }
    assert sampling_refused("triton", asked) == "logprobs"
