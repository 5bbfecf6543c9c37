"""Faults for real worker processes, loaded only by ``worker_settings`` (CELERY_IMPORTS).

The parse stage of a document whose text starts with a marker misbehaves:

- ``CRASH`` kills its own process, as a segfault or the kernel's OOM killer would;
- ``SLOW`` sleeps past the soft time limit;
- ``HANG`` ignores the soft time limit as well (as C code holding the interpreter does),
  until the hard limit kills the process;
- ``HOG`` allocates 2 GiB, past ``WORKER_CHILD_MEMORY_LIMIT_MB``.

Every parse is recorded, one line per call, in the file named by ``SABOTAGE_LOG``, so
that tests count deliveries. ``SlowFakeEmbedder`` is the fake embedder, slowed down so
that a test can stop the worker halfway through a document.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from apps.knowledge.services import stages
from retrieval import ParsedDocument
from retrieval.embedders import Embeddings, FakeEmbedder

_parse_document = stages.parse_document_bounded


def parse_document_bounded(data: bytes, **options: Any) -> ParsedDocument:
    log = os.environ.get("SABOTAGE_LOG")
    if log:
        with open(log, "a") as out:
            out.write(f"{os.getpid()} {data[:5].decode(errors='replace')} {time.time():.2f}\n")
    if data.startswith(b"CRASH"):
        os.kill(os.getpid(), signal.SIGKILL)
    elif data.startswith(b"SLOW"):
        time.sleep(60)
    elif data.startswith(b"HANG"):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(SoftTimeLimitExceeded):  # deaf to it
                time.sleep(1)
    elif data.startswith(b"HOG"):
        hog = bytearray(2 * 1024**3)
        del hog
    return _parse_document(data, **options)


stages.parse_document_bounded = parse_document_bounded


class SlowFakeEmbedder(FakeEmbedder):
    """Takes ``SLOW_EMBED_SECONDS`` (default 0.02) per text."""

    def embed(self, texts: Sequence[str]) -> Embeddings:
        time.sleep(float(os.environ.get("SLOW_EMBED_SECONDS", "0.02")) * len(texts))
        return super().embed(texts)
