"""The tokenizer a dotted path names, loaded once per process."""

from __future__ import annotations

import functools
import importlib
import threading
from typing import Any

from inference.errors import TokenizerUnavailable
from inference.tokenizers.base import Tokenizer


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
