"""The web process's start: models loaded before the first request, the startup heap
frozen out of the garbage collector, and a model that cannot load never stops the start."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from apps.chat.services.registry import model_registry
from apps.knowledge.services import indexing
from apps.site import warmup
from inference.tokenizers import loading


@pytest.fixture
def collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_the_start_loads_the_models_and_freezes_the_heap(collector: None, settings: Any) -> None:
    indexing._embedder.cache_clear()
    loading._load.cache_clear()
    settings.WEB_GC_THRESHOLDS = (12_345, 20, 30)
    warmup.web_process_start()
    assert indexing._embedder.cache_info().currsize == 1
    loaded = {entry.tokenizer for entry in model_registry()}
    assert loading._load.cache_info().currsize == len(loaded) > 0
    assert gc.get_freeze_count() > 10_000
    assert gc.get_threshold() == (12_345, 20, 30)


def test_a_model_that_cannot_load_is_logged_not_raised(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    indexing._embedder.cache_clear()
    settings.EMBEDDER_BACKEND = "retrieval.embedders.Nope"
    caplog.set_level(logging.WARNING, logger="apps.site.warmup")
    warmup.warm_up()
    assert "embedder not loaded at start" in caplog.text
    indexing._embedder.cache_clear()
