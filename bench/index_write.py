"""What adding one document costs the index: a FAISS delta, a FAISS rewrite, a Milvus upsert.

What is measured
    For each of ``--backends`` (default both), a collection of ``--size`` chunks (default
    100k, random unit-norm 384-d vectors, its index written by ``collection_index_rebuild``
    in that backend) gets one 10-chunk document per round. Each round times, in
    alternating order (the two backends' pairs too), each way to put it in the index:

    faiss append     today's path: ``collection_index_append`` on a FAISS collection (row
                     lock, the 10 chunks' texts read and tokenised, one flat delta segment
                     of 10 vectors + postings written as one fsynced folder, row update,
                     commit).
    faiss rewrite    the path it replaced (the code before it, replicated): row lock, read
                     the whole base FAISS file, add the 10 vectors, write the whole file
                     (fsync), row update, commit. Its keyword half, rebuilding the
                     collection's BM25 postings from every chunk's text, is timed apart as
                     ``keyword rebuild`` over ``--keyword-rounds`` rounds (seconds to
                     minutes).
    milvus append    ``collection_index_append`` on a collection whose ``index_backend`` is
                     milvus, through the product: row lock, the 10 chunks' texts read and
                     analysed, one upsert of 10 rows into the engine, row update, commit.
    milvus upsert    the engine's share alone: ``MilvusIndex.upsert`` of the same 10 rows
                     (texts read beforehand), no transaction.

    Then, for FAISS, one compaction (``collection_index_compact``, forced) merges base and
    the deltas the rounds appended; 50 one-query dense searches run over base + deltas and
    over the compacted base (p50 of each, and whether their results are equal). The same
    queries are timed through each backend's ``dense_search`` after the rounds, and for
    Milvus again after a flush (Milvus Lite keeps its latest writes, up to 128 MB, in a
    memory table that a search reads row by row; a flush writes them to an indexed
    segment; the product never asks for one). The table
    gives p50 / p95 in milliseconds and the ratios of the medians, measured in the same
    run, plus the load average before and after.

How
    Django in-process on the embedded default settings with ``RAGTIER_DATA_DIR`` on a fresh
    temp folder (a new SQLite file; index files there too), ``VECTOR_INDEX_KIND`` as
    ``--kind`` (default flat: the kind the 2.6 s figure was measured on). Compaction is not
    triggered by the appends (``INDEX_COMPACT_DELTAS`` is raised) so that every round
    appends to the same base. Milvus is Milvus Lite as ``manage.py runstack`` runs it
    (``milvus-lite server`` in its own process, data in the temp folder, ``MILVUS_INDEX``
    HNSW), left to finish the background index builds of the rebuild before the rounds;
    Milvus Lite is Milvus's API in Python for development, not the engine of a Milvus
    standalone or cluster (C++ and Go). Wall clock via ``time.perf_counter``; nothing is
    asserted.

Run
    HF_HUB_OFFLINE=1 .venv/bin/python bench/index_write.py [--size 100000] [--rounds 30]
        [--backends faiss milvus]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/index_write.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402
    CHUNK_TEXT,
    Fixture,
    Services,
    create_fixture,
    random_unit_vectors,
    settle,
    setup_django,
    start_milvus_lite,
)

CHUNKS_PER_DOCUMENT = 10
FAISS_APPEND = "faiss append (delta segment)"
FAISS_REWRITE = "faiss rewrite (whole FAISS file)"
FAISS_KEYWORDS = "faiss keyword rebuild (whole)"
MILVUS_APPEND = "milvus append (product)"
MILVUS_UPSERT = "milvus upsert (MilvusIndex)"


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


def milvus_rows(collection: Any, ids: np.ndarray, vectors: np.ndarray) -> Any:
    """The rows the Milvus backend writes for these chunks, read beforehand."""
    from apps.knowledge.backends import chunk_texts
    from apps.knowledge.backends.milvus import scope
    from retrieval.milvus import MilvusRows

    chunks = chunk_texts(collection_id=collection.pk, ids=ids)
    position = {int(pk): n for n, pk in enumerate(ids)}
    return MilvusRows(
        ids=chunks.ids,
        vectors=vectors[[position[int(pk)] for pk in chunks.ids]],
        texts=chunks.texts,
        scope=scope(collection),
        documents=chunks.documents,
    )


def upsert(rows: Any) -> float:
    from apps.knowledge.backends.milvus import engine

    started = time.perf_counter()
    engine().upsert(rows)
    return time.perf_counter() - started


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


def search_times(search: Callable[[np.ndarray], object], queries: np.ndarray) -> list[float]:
    """Milliseconds of one-query dense searches."""
    times = []
    for query in queries:
        started = time.perf_counter()
        search(query)
        times.append((time.perf_counter() - started) * 1000)
    return times


def backend_search(collection: Any) -> Callable[[np.ndarray], object]:
    """One dense search of ``collection`` through its backend, as the search service
    calls it (no filter)."""
    from apps.knowledge.backends import backend_of

    backend = backend_of(collection)
    return lambda query: backend.dense_search([collection], query, 10, None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000, help="chunks in the collection")
    parser.add_argument("--rounds", type=int, default=30, help="documents added")
    parser.add_argument("--keyword-rounds", type=int, default=2)
    parser.add_argument("--kind", default="flat", help="VECTOR_INDEX_KIND for the base")
    parser.add_argument(
        "--backends", nargs="+", default=["faiss", "milvus"], choices=["faiss", "milvus"]
    )
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the temp data folder")
    args = parser.parse_args(argv)

    data_dir = Path(tempfile.mkdtemp(prefix="ragtier-bench-index-write-"))
    services = Services(data_dir)
    load_before = os.getloadavg()
    try:
        extra = {}
        if "milvus" in args.backends:
            extra["MILVUS_URI"] = start_milvus_lite(services, data_dir / "milvus")
            extra["MILVUS_INDEX"] = "HNSW"
        setup_django(
            data_dir,
            migrate=True,
            VECTOR_INDEX_KIND=args.kind,
            INDEX_COMPACT_DELTAS=str(args.rounds + 10),
            **extra,
        )
        from django.db import connection

        from apps.knowledge.models import Collection
        from apps.knowledge.services import (
            collection_index_compact,
            collection_index_load,
            index_store,
        )

        print(
            f"data dir: {data_dir} ({connection.vendor}); kind {args.kind}; "
            f"backends {' '.join(args.backends)}; cpus {os.cpu_count()}"
        )
        fixtures: dict[str, Fixture] = {}
        for backend in args.backends:
            fixture = create_fixture(
                args.size, batch_size=args.batch_size, seed=args.seed, backend=backend
            )
            fixtures[backend] = fixture
            print(
                f"{backend} collection of {args.size} chunks: rows {fixture.insert_seconds:.1f} s, "
                f"index (vectors + keywords) {fixture.rebuild_seconds:.1f} s",
                flush=True,
            )
        if "milvus" in fixtures:
            waited = settle(services.started[-1].process.pid)
            print(f"milvus: background compaction and index builds went on {waited:.0f} s more")

        rng = np.random.default_rng(args.seed + 1)
        times: dict[str, list[float]] = {}
        for number in range(args.rounds):
            pairs: list[list[tuple[str, Callable[[], float]]]] = []
            if "faiss" in fixtures:
                collection_id = fixtures["faiss"].collection.pk
                ids, vectors = new_document(fixtures["faiss"].collection, rng)
                pairs.append(
                    [
                        (FAISS_APPEND, functools.partial(append, collection_id, ids, vectors)),
                        (FAISS_REWRITE, functools.partial(rewrite, collection_id, ids, vectors)),
                    ]
                )
            if "milvus" in fixtures:
                collection = fixtures["milvus"].collection
                ids, vectors = new_document(collection, rng)
                rows = milvus_rows(collection, ids, vectors)
                pairs.append(
                    [
                        (MILVUS_APPEND, functools.partial(append, collection.pk, ids, vectors)),
                        (MILVUS_UPSERT, functools.partial(upsert, rows)),
                    ]
                )
            if number % 2:
                pairs = [pair[::-1] for pair in pairs[::-1]]
            for pair in pairs:
                for label, run in pair:
                    times.setdefault(label, []).append(run())

        lines: list[str] = []
        queries = random_unit_vectors(rng, 50)
        if "faiss" in fixtures:
            collection_id = fixtures["faiss"].collection.pk
            times[FAISS_KEYWORDS] = [
                keyword_rebuild(collection_id) for _ in range(args.keyword_rounds)
            ]
            collection = Collection.objects.get(pk=collection_id)
            deltas = collection.index_version - collection.index_base
            segmented = collection_index_load(collection)
            before = segmented.search(queries, 10)
            search_before = search_times(lambda query: segmented.search(query, 10), queries)
            through = search_times(backend_search(collection), queries)
            started = time.perf_counter()
            collection_index_compact(collection_id=collection_id, force=True)
            compaction = time.perf_counter() - started
            collection.refresh_from_db()
            compacted = collection_index_load(collection)
            after = compacted.search(queries, 10)
            search_after = search_times(lambda query: compacted.search(query, 10), queries)
            delta_bytes = sum(
                entry.stat().st_size
                for folder in (index_store().root / collection.index_key).glob("*.delta")
                for entry in folder.iterdir()
            )
            lines += [
                f"compaction of base + {deltas} deltas: {compaction * 1000:.0f} ms "
                f"(deltas on disk: {delta_bytes / 1e6:.1f} MB); search after == before: "
                f"{before == after}",
                f"dense search p50, one query: base + {deltas} deltas "
                f"{statistics.median(search_before):.2f} ms, compacted "
                f"{statistics.median(search_after):.2f} ms",
                f"dense search p50 through FaissBackend.dense_search, base + {deltas} deltas: "
                f"{statistics.median(through):.2f} ms",
            ]
        if "milvus" in fixtures:
            from apps.knowledge.backends.milvus import engine

            collection = Collection.objects.get(pk=fixtures["milvus"].collection.pk)
            through = search_times(backend_search(collection), queries)
            engine().client.flush(engine().name)
            settle(services.started[-1].process.pid)
            flushed = search_times(backend_search(collection), queries)
            lines.append(
                f"dense search p50 through MilvusBackend.dense_search: after the rounds "
                f"{statistics.median(through):.2f} ms, after MilvusClient.flush "
                f"{statistics.median(flushed):.2f} ms"
            )
        load_after = os.getloadavg()

        order = [FAISS_APPEND, FAISS_REWRITE, FAISS_KEYWORDS, MILVUS_APPEND, MILVUS_UPSERT]
        print(f"\nadding one {CHUNKS_PER_DOCUMENT}-chunk document to {args.size} chunks, ms")
        print(f"{'':<34}{'p50':>10}{'p95':>10}{'n':>5}")
        for label in order:
            if label not in times:
                continue
            ms = [v * 1000 for v in times[label]]
            print(
                f"{label:<34}{statistics.median(ms):>10.1f}{percentile(ms, 0.95):>10.1f}"
                f"{len(ms):>5}"
            )
        p50 = {label: statistics.median(values) for label, values in times.items()}
        if "faiss" in fixtures:
            append_p50 = p50[FAISS_APPEND]
            rewrite_p50 = p50[FAISS_REWRITE]
            keywords_p50 = p50[FAISS_KEYWORDS]
            print(f"faiss rewrite / append (p50):           {rewrite_p50 / append_p50:8.1f}x")
            print(
                "(rewrite + keyword rebuild) / append:   "
                f"{(rewrite_p50 + keywords_p50) / append_p50:8.1f}x"
            )
        if "milvus" in fixtures:
            milvus_p50 = p50[MILVUS_APPEND]
            share = p50[MILVUS_UPSERT] / milvus_p50
            print(f"milvus upsert / milvus append (p50):    {share:8.2f}")
            if "faiss" in fixtures:
                ratio = milvus_p50 / p50[FAISS_APPEND]
                print(f"milvus append / faiss append (p50):     {ratio:8.1f}x")
        for line in lines:
            print(line)
        print(
            "load average (1, 5, 15 min): before "
            + " ".join(f"{v:.2f}" for v in load_before)
            + ", after "
            + " ".join(f"{v:.2f}" for v in load_after)
        )
    finally:
        services.stop_all()
        if args.keep:
            print(f"kept {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
