"""LlamaIndex's ``OpenAILike``, unmodified, against the app at RAGTIER_BASE_URL with
RAGTIER_API_KEY. Usage: python clients.py <case> [json options]; prints one JSON object,
the case's result. It runs in its own environment (``requirements.txt``, built by ``make
test`` as ``.venv-llamaindex``), since LlamaIndex needs openai<3 and the suite pins 3;
``tests/apps/chat/test_clients_llamaindex.py`` runs it and checks what it prints."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import openai
from llama_index.core.llms import ChatMessage
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike

OPTIONS: dict[str, Any] = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}


def model(**fields: Any) -> OpenAILike:
    fields = {"is_chat_model": True, "max_retries": 0, "timeout": 120, **fields}
    return OpenAILike(
        model="small",
        api_base=f"{os.environ['RAGTIER_BASE_URL']}/v1",
        api_key=os.environ["RAGTIER_API_KEY"],
        **fields,
    )


def ask(text: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=text)]


def whole() -> dict[str, Any]:
    llm = model(temperature=0.4)
    completed = llm.complete("Say hello").text
    reply = llm.chat([ChatMessage(role="system", content="Be brief."), *ask("Say hello")])
    usage = reply.raw.usage
    return {
        "complete": completed,
        "chat": reply.message.content,
        "usage": [usage.prompt_tokens, usage.completion_tokens],
    }


def streamed() -> dict[str, Any]:
    llm = model()
    completed = list(llm.stream_complete("Say hello"))
    chatted = list(llm.stream_chat(ask("Say hello")))
    return {
        "completeDeltas": [part.delta for part in completed if part.delta],
        "completeText": completed[-1].text,
        "chatDeltas": [part.delta for part in chatted if part.delta],
        "chatText": chatted[-1].message.content,
    }


def legacy() -> dict[str, Any]:
    try:
        model(is_chat_model=False).complete("Say hello")
    except openai.NotFoundError as exc:
        return {"status": exc.status_code}
    return {"status": 200}


def get_weather(city: str) -> str:
    """The weather in a city."""
    return "18 C and sunny"


def tools() -> dict[str, Any]:
    llm = model(is_function_calling_model=True, additional_kwargs={"extra_body": OPTIONS["extra"]})
    tool = FunctionTool.from_defaults(fn=get_weather)
    response = llm.chat_with_tools([tool], user_msg="What is the weather in Paris?")
    calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=True)
    return {"calls": [[c.tool_id, c.tool_name, c.tool_kwargs] for c in calls]}


def real() -> dict[str, Any]:
    llm = model(temperature=0, max_tokens=40, additional_kwargs={"extra_body": OPTIONS["extra"]})
    chunks = list(llm.stream_chat(ask(OPTIONS["question"])))
    return {"chunks": len(chunks), "text": chunks[-1].message.content}


CASES = {"whole": whole, "streamed": streamed, "legacy": legacy, "tools": tools, "real": real}

if __name__ == "__main__":
    sys.stdout.write(json.dumps(CASES[sys.argv[1]]()))
