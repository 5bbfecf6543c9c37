"""What adding one document costs the index: appending a delta against rewriting it whole.

What is measured
    A collection of ``--size`` chunks (default 100k, random unit-norm 384-d vectors, a base
    index written by ``collection_index_rebuild``) gets one 10-chunk document per round.
    Each round times, in alternating order, both ways to put it in the index, each in its
    own transaction with its commit:

    append     today's path: ``collection_index_append`` (row lock, the 10 chunks' texts
               read and tokenised, one flat delta segment of 10 vectors + postings written
               as one fsynced folder, row update, commit).
    rewrite    the path it replaced (the code before this change, replicated): row lock,
               read the whole base FAISS file, add the 10 vectors, write the whole file
               (fsync), row update, commit. Its keyword half, rebuilding the collection's
               BM25 postings from every chunk's text, is timed apart as ``keyword rebuild``
               over ``--keyword-rounds`` rounds (it takes seconds to minutes).

    Then one compaction (``collection_index_compact``, forced) merges base and the deltas
    the rounds appended; 50 one-query dense searches run over base + deltas and over the
    compacted base (p50 of each, and whether their results are equal). The table gives
    p50 / p95 in milliseconds and the ratio of the medians, measured in the same run,
    plus the load average before and after.

How
    Django in-process on the embedded default settings with ``RAGTIER_DATA_DIR`` on a fresh
    temp folder (a new SQLite file; index files there too), ``VECTOR_INDEX_KIND`` as
    ``--kind`` (default flat: the kind the 2.6 s figure was measured on). Compaction is not
    triggered by the appends (``INDEX_COMPACT_DELTAS`` is raised) so that every round
    appends to the same base. Wall clock via ``time.perf_counter``; nothing is asserted.

Run
    HF_HUB_OFFLINE=1 .venv/bin/python bench/index_write.py [--size 100000] [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/index_write.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402
    CHUNK_TEXT,
    create_fixture,
    random_unit_vectors,
    setup_django,
)

CHUNKS_PER_DOCUMENT = 10


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def new_document(collection: Any, rng: np.random.Generator) -> tuple[Any, np.ndarray]:
    """A 10-chunk document's rows, committed; returns its chunk ids and vectors."""
    from apps.knowledge.models import Chunk, Document

    document = Document.objects.create(
        team=collection.team,
        collection=collection,
        title="Appended",
        filename="append.txt",
        media_type="text/plain",
        source="bench/append.txt",
        size_bytes=0,
        content_hash=uuid.uuid4().hex,
        status=Document.Status.INDEXED,
        stage=Document.Stage.DONE,
        chunk_count=CHUNKS_PER_DOCUMENT,
    )
    vectors = random_unit_vectors(rng, CHUNKS_PER_DOCUMENT)
    chunks = Chunk.objects.bulk_create(
        Chunk(
            document=document,
            collection=collection,
            index=i,
            text=CHUNK_TEXT.format(i=i),
            headings=[],
            token_count=200,
            embedding=vectors[i].tobytes(),
        )
        for i in range(CHUNKS_PER_DOCUMENT)
    )
    return np.array([chunk.pk for chunk in chunks], dtype=np.int64), vectors


def append(collection_id: int, ids: np.ndarray, vectors: np.ndarray) -> float:
    from django.db import transaction

    from apps.knowledge.services.indexing import collection_index_append

    started = time.perf_counter()
    with transaction.atomic():
        collection_index_append(
            collection_id=collection_id, ids=ids, vectors=vectors, tombstones=ids
        )
    return time.perf_counter() - started


def rewrite(collection_id: int, ids: np.ndarray, vectors: np.ndarray) -> float:
    """The replaced path's vector half: the whole base read, extended and written again."""
    from django.db import transaction

    from apps.knowledge.models import Collection
    from apps.knowledge.services import index_store
    from retrieval import VectorIndex

    store = index_store()
    started = time.perf_counter()
    with transaction.atomic():
        collection = Collection.objects.select_for_update().get(pk=collection_id)
        index = VectorIndex.read(
            store.path(collection.index_key, collection.index_base), dimension=store.dimension
        )
        index.remove(ids)
        index.add(ids, vectors)
        # Written beside the live files under a name no state uses, then dropped: the
        # collection's own state stays base + deltas for the append rounds.
        scratch = store.root / collection.index_key / "rewrite.faiss"
        index.write(scratch)
        Collection.objects.filter(pk=collection_id).update(name=collection.name)
    elapsed = time.perf_counter() - started
    scratch.unlink()
    return elapsed


def keyword_rebuild(collection_id: int) -> float:
    from apps.knowledge.backends.faiss import keyword_index_build
    from apps.knowledge.models import Chunk

    ids = np.array(
        Chunk.objects.filter(collection_id=collection_id).values_list("pk", flat=True),
        dtype=np.int64,
    )
    started = time.perf_counter()
    keyword_index_build(collection_id=collection_id, ids=ids)
    return time.perf_counter() - started


def search_times(index: Any, queries: np.ndarray) -> list[float]:
    """Milliseconds of one-query dense searches over ``index``."""
    times = []
    for query in queries:
        started = time.perf_counter()
        index.search(query, 10)
        times.append((time.perf_counter() - started) * 1000)
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000, help="chunks in the collection")
    parser.add_argument("--rounds", type=int, default=30, help="documents added")
    parser.add_argument("--keyword-rounds", type=int, default=2)
    parser.add_argument("--kind", default="flat", help="VECTOR_INDEX_KIND for the base")
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the temp data folder")
    args = parser.parse_args(argv)

    data_dir = Path(tempfile.mkdtemp(prefix="ragtier-bench-index-write-"))
    load_before = os.getloadavg()
    try:
        setup_django(
            data_dir,
            migrate=True,
            VECTOR_INDEX_KIND=args.kind,
            INDEX_COMPACT_DELTAS=str(args.rounds + 10),
        )
        from django.db import connection

        from apps.knowledge.models import Collection
        from apps.knowledge.services import (
            collection_index_compact,
            collection_index_load,
            index_store,
        )

        print(
            f"data dir: {data_dir} ({connection.vendor}); kind {args.kind}; cpus {os.cpu_count()}"
        )
        fixture = create_fixture(args.size, batch_size=args.batch_size, seed=args.seed)
        collection_id = fixture.collection.pk
        print(
            f"collection of {args.size} chunks: rows {fixture.insert_seconds:.1f} s, "
            f"base index (vectors + keywords) {fixture.rebuild_seconds:.1f} s"
        )
        rng = np.random.default_rng(args.seed + 1)
        appends: list[float] = []
        rewrites: list[float] = []
        for number in range(args.rounds):
            ids, vectors = new_document(fixture.collection, rng)
            if number % 2:
                rewrites.append(rewrite(collection_id, ids, vectors))
                appends.append(append(collection_id, ids, vectors))
            else:
                appends.append(append(collection_id, ids, vectors))
                rewrites.append(rewrite(collection_id, ids, vectors))
        keywords = [keyword_rebuild(collection_id) for _ in range(args.keyword_rounds)]

        collection = Collection.objects.get(pk=collection_id)
        deltas = collection.index_version - collection.index_base
        queries = random_unit_vectors(rng, 50)
        segmented = collection_index_load(collection)
        before = segmented.search(queries, 10)
        search_before = search_times(segmented, queries)
        started = time.perf_counter()
        collection_index_compact(collection_id=collection_id, force=True)
        compaction = time.perf_counter() - started
        collection.refresh_from_db()
        compacted = collection_index_load(collection)
        after = compacted.search(queries, 10)
        search_after = search_times(compacted, queries)
        delta_bytes = sum(
            entry.stat().st_size
            for folder in (index_store().root / collection.index_key).glob("*.delta")
            for entry in folder.iterdir()
        )
        load_after = os.getloadavg()

        rows = [
            ("append (delta segment)", appends),
            ("rewrite (whole FAISS file)", rewrites),
            ("keyword rebuild (whole)", keywords),
        ]
        print(f"\nadding one {CHUNKS_PER_DOCUMENT}-chunk document to {args.size} chunks, ms")
        print(f"{'':<28}{'p50':>10}{'p95':>10}{'n':>5}")
        for label, values in rows:
            ms = [v * 1000 for v in values]
            print(
                f"{label:<28}{statistics.median(ms):>10.1f}{percentile(ms, 0.95):>10.1f}"
                f"{len(ms):>5}"
            )
        append_p50 = statistics.median(appends)
        ratio = statistics.median(rewrites) / append_p50
        print(f"rewrite / append (p50):                 {ratio:8.1f}x")
        print(
            "(rewrite + keyword rebuild) / append:   "
            f"{(statistics.median(rewrites) + statistics.median(keywords)) / append_p50:8.1f}x"
        )
        print(
            f"compaction of base + {deltas} deltas: {compaction * 1000:.0f} ms "
            f"(deltas on disk: {delta_bytes / 1e6:.1f} MB); search after == before: "
            f"{before == after}"
        )
        print(
            f"dense search p50, one query: base + {deltas} deltas "
            f"{statistics.median(search_before):.2f} ms, compacted "
            f"{statistics.median(search_after):.2f} ms"
        )
        print(
            "load average (1, 5, 15 min): before "
            + " ".join(f"{v:.2f}" for v in load_before)
            + ", after "
            + " ".join(f"{v:.2f}" for v in load_after)
        )
    finally:
        if args.keep:
            print(f"kept {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
