"""The local tokenizer agrees with the real llama.cpp server, token for token."""

from __future__ import annotations

import httpx
import pytest

from inference import GGUFTokenizer
from inference.tokenizers import ChatMessage

pytestmark = pytest.mark.integration

CODE = (
    'def fib(n: int) -> int:\n    """Fibonacci."""\n'
    "    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
)
SAMPLES: list[str] = [
    "Hello",
    "What is RAG?",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\n\n",
    "Ünïcödé çharacters: naïve café, Straße, Ærøskøbing",
    "日本語のテキストです。",
    "中文问题\uff1a什么是向量索引\uff1f",
    "Emoji 🚀🔥👩‍💻 and flags 🇫🇷",
    "Математика и физика",
    "עברית וערבית: مرحبا",
    CODE,
    "SELECT * FROM chunks WHERE id IN (1, 2, 3);",
    "<html><body><p>tags</p></body></html>",
    '{"json": [1, 2.5, null, true], "k": "v"}',
    "1234567890 3.14159 -42 1e10",
    "a" * 500,
    "word " * 300,
    "The quick brown fox jumps over the lazy dog. " * 20,
    "<|im_start|> looks like a special token",
    "C:\\Windows\\path and /usr/local/bin",
    "Mixed: café ☕ code `x = 1` and math ∑∫√∞",
    "\u200bzero\u200bwidth\u200bspaces",
    "Ends with a question?",
    "line1\r\nline2\r\n",
    "    indented code block",
]


def conversations() -> list[list[ChatMessage]]:
    convs: list[list[ChatMessage]] = [[{"role": "user", "content": s}] for s in SAMPLES]
    convs += [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": s}]
        for s in SAMPLES[:13]
    ]
    history: list[ChatMessage] = [{"role": "system", "content": "You answer from passages."}]
    for i in range(12):
        history = [*history, {"role": "user", "content": f"Question {i}: {SAMPLES[i]}"}]
        convs.append(history)
        history = [*history, {"role": "assistant", "content": f"Answer {i} ✓"}]
    return convs


def test_local_count_equals_the_servers_prompt_tokens(llama_server: str) -> None:
    tokenizer = GGUFTokenizer()
    cases = conversations()
    assert len(cases) >= 50
    mismatches = []
    with httpx.Client(base_url=llama_server, timeout=120) as client:
        for messages in cases:
            response = client.post(
                "/chat/completions",
                json={"model": "small", "messages": messages, "max_tokens": 1},
            )
            assert response.status_code == 200, response.text
            served = response.json()["usage"]["prompt_tokens"]
            local = tokenizer.count_chat(messages)
            if served != local:
                mismatches.append((messages[-1]["content"][:40], served, local))
    assert not mismatches, mismatches


def test_count_of_plain_text_matches_the_servers_tokenize_endpoint(llama_server: str) -> None:
    tokenizer = GGUFTokenizer()
    root = llama_server.removesuffix("/v1")
    for text in SAMPLES:
        response = httpx.post(f"{root}/extras/tokenize/count", json={"input": text}, timeout=30)
        assert response.json()["count"] == tokenizer.count(text), text[:40]
