"""The web process's start, before it listens: what the first requests would wait for is
loaded (the embedder, with torch; each model's tokenizer), then the heap made so far is
frozen out of the cyclic garbage collector.

Why the collector: CPython 3.11 collects the oldest generation all at once, stopping the
event loop and so every open stream. The startup heap is half a million objects that live
as long as the process (a full collection of them alone is a long stall: docs/gateway.md);
frozen, they are never traversed again. A thousand open streams still hold ~250 objects each (their
coroutine chains), so the young generation is collected less often
(``WEB_GC_THRESHOLDS``): fewer objects that live a quarter second (a journal batch) reach
the oldest generation and set off a full collection.
"""

from __future__ import annotations

import gc
import logging

from django.conf import settings

from apps.chat.services.registry import model_registry
from apps.knowledge.services.indexing import embedder

logger = logging.getLogger(__name__)


def web_process_start() -> None:
    warm_up()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*settings.WEB_GC_THRESHOLDS)


def warm_up() -> None:
    """Load the embedder and the tokenizers now. One that cannot load is logged, not
    raised: the requests that need it answer with their own clear error, and /readyz
    says what is missing."""
    try:
        embedder()
    except Exception as exc:  # any failure to load is the request's to report
        logger.warning("embedder not loaded at start: %s", exc)
    try:
        entries = list(model_registry())
    except Exception as exc:
        logger.warning("model registry not read at start: %s", exc)
        return
    for entry in entries:
        try:
            entry.tokenizer.load()
        except Exception as exc:
            logger.warning("tokenizer of %s not loaded at start: %s", entry.alias, exc)
