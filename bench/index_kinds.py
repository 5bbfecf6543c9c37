"""The index kinds side by side, FAISS and Milvus Lite: build, memory, query latency, recall@10.

What is measured
    For each size (``--sizes``, default 100k and 1M) and kind (``--kinds``), an index over
    synthetic 384-d unit vectors clustered around 1,000 random centres (embeddings cluster
    by topic; uniform noise is the one case no real corpus looks like), with chunk ids
    that are not positions. The kinds:

    flat, hnsw, ivf     ``retrieval.VectorIndex.build`` (the FAISS backend's base index).
    milvus-hnsw,        the Milvus backend's engine through ``retrieval.MilvusIndex``
    milvus-flat,        with ``MILVUS_INDEX`` HNSW, FLAT or IVF_FLAT, on Milvus Lite run
    milvus-ivf          as ``manage.py runstack`` runs it (``milvus-lite server``, a process
                        of its own, fresh for each kind and size). Every chunk is written
                        by ``MilvusIndex.upsert`` in one scope (one team's collection),
                        with a ``--words``-word Zipf text for its BM25 terms.

    build      seconds until the index answers from its built form. FAISS: the build
               (for ivf: k-means training on a sample, then adding). Milvus: the upserts,
               a flush, and the engine's background compaction and segment index builds
               until the server is idle (``settle``); the insert share is printed apart.
    file MB    the serialized index (faiss's own layout); for Milvus, the data folder.
    RSS MB     resident memory the index adds to the process that holds it, measured
               (``/proc/<pid>/status``). FAISS: this process's VmRSS after the build
               minus before it (taken after ``malloc_trim``; the vectors it was built
               from are held throughout). Milvus: the server's VmRSS, restarted on the
               built data folder, after loading the collection and running the queries,
               minus a fresh server's with no collection; the server's peak while
               building (VmHWM) is printed apart.
    B/vec      RSS bytes per vector (x 1M: memory per million chunks).
    p50, p99   one query at a time, ``--queries`` queries drawn from the same centres,
               after 20 warm-up queries, milliseconds: ``VectorIndex.search(q, 10)``, or
               ``MilvusIndex.dense_search(q, 10, ...)`` with the filter a search sends
               (the scope and the team), over gRPC to the server. For Milvus the same
               queries are printed again straight through ``MilvusClient.search`` with no
               filter (the engine's own share), and BM25 keyword searches of four words
               of a random chunk (``MilvusIndex.keyword_search``).
    recall@10  share of an exact search's 10 best ids found, averaged over the queries.
    ``--ivf-probes`` and ``--hnsw-beams`` add the same query figures at other nprobe
    (ivf) and efSearch (hnsw) values, for the FAISS kinds.

    The last lines print the sizes at which ``VECTOR_INDEX_KIND=auto`` switches kind
    (``retrieval.index.kind_for_size``) and a 10M line extrapolated from the measured
    ones (flat and ivf scale linearly in n for build and memory, flat linearly for query
    time, ivf with nprobe / nlist; hnsw's build as n log n), marked as extrapolated.

How
    In one process, FAISS on ``--threads`` OpenMP threads (default: what the machine has,
    as a build would get; queries are single); the Milvus Lite server in another, queried
    one request at a time. Milvus Lite is a pure-Python engine for development (Parquet
    segments, FAISS inside for HNSW and IVF, BM25 in Python); a Milvus standalone or
    cluster is another engine (C++ and Go), and these are not its figures. Wall clock via
    ``time.perf_counter``; the 1-, 5- and 15-minute load averages are printed before and
    after, since every figure here moves with what else the machine runs. Nothing is
    asserted.

Run
    .venv/bin/python bench/index_kinds.py [--sizes 100000 1000000]
        [--kinds flat hnsw ivf milvus-hnsw milvus-flat milvus-ivf]
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/index_kinds.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402
    Services,
    folder_bytes,
    peak_rss_bytes,
    rss_bytes,
    settle,
    start_milvus_lite,
    stop_milvus_lite,
    synthetic_texts,
)
from retrieval import Hit, VectorIndex, keyword_query, set_search_threads  # noqa: E402
from retrieval.index import (  # noqa: E402
    AUTO_HNSW_FROM,
    AUTO_IVF_FROM,
    IVF_MIN_SIZE,
    ivf_lists,
    ivf_probes,
)
from retrieval.milvus import MilvusIndex, MilvusRows, Scope, Where  # noqa: E402

DIMENSION = 384
CENTRES = 1000
MILVUS_KINDS = {"milvus-hnsw": "HNSW", "milvus-flat": "FLAT", "milvus-ivf": "IVF_FLAT"}
SCOPE = Scope(team=1, collection=1)
WHERE = Where(team=SCOPE.team, scopes=[SCOPE])
WRITE_ROWS = 10_000  # rows per upsert call; MilvusIndex sends them 1,000 a request


def clustered(rng: np.random.Generator, centres: np.ndarray, count: int) -> np.ndarray:
    out = np.empty((count, DIMENSION), dtype=np.float32)
    for start in range(0, count, 100_000):  # in slices: 1M at once would double the peak
        stop = min(start + 100_000, count)
        block = centres[rng.integers(0, len(centres), stop - start)]
        block += 0.6 * rng.standard_normal(block.shape, dtype=np.float32)
        out[start:stop] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def measure(
    kind: str,
    ids: np.ndarray,
    vectors: np.ndarray,
    *,
    queries: np.ndarray,
    truth: list[set[int]],
    threads: int,
    sweep: dict[str, Sequence[int]],
) -> dict[str, float]:
    set_search_threads(threads)  # builds use the machine...
    resident = trimmed_rss()
    started = time.perf_counter()
    index = VectorIndex.build(DIMENSION, kind, ids=ids, vectors=vectors)  # type: ignore[arg-type]
    build = time.perf_counter() - started
    resident = rss_bytes(os.getpid()) - resident
    set_search_threads(1)  # ...queries come one at a time, one thread each (the app's)
    memory = len(faiss.serialize_index(index._raw))
    row = {
        "build": build,
        "memory": memory,
        "rss": resident,
        **query_figures(lambda query: index.search(query, 10)[0], queries, truth),
    }
    for value in sweep.get(kind, ()):
        if kind == "ivf":
            index._raw.nprobe = value
            label = f"nprobe {value:>5} of {index.lists}"
        else:
            faiss.downcast_index(index._raw.index).hnsw.efSearch = value
            label = f"efSearch {value:>5}"
        figures = query_figures(lambda query: index.search(query, 10)[0], queries, truth)
        print(
            f"{'':>9} {kind} {label}: p50 {figures['p50']:.2f} ms, "
            f"p99 {figures['p99']:.2f} ms, recall@10 {figures['recall']:.3f}",
            flush=True,
        )
    return row


def trimmed_rss() -> int:
    """This process's RSS once the allocator has handed its free pages back, so that an
    index built next in memory an earlier one freed still counts as the build's."""
    ctypes.CDLL(None).malloc_trim(0)
    return rss_bytes(os.getpid())


def measure_milvus(
    kind: str,
    ids: np.ndarray,
    vectors: np.ndarray,
    *,
    texts: list[str],
    queries: np.ndarray,
    truth: list[set[int]],
    keywords: list[str],
) -> dict[str, float]:
    """Write, settle, restart, load and query one Milvus Lite server's collection."""
    work = Path(tempfile.mkdtemp(prefix="ragtier-bench-index-kinds-"))
    services = Services(work)
    try:
        uri = start_milvus_lite(services, work / "engine")
        server = services.started[-1].process.pid
        empty = rss_bytes(server)
        engine = MilvusIndex(
            uri, name="bench_chunks", dimension=DIMENSION, index=MILVUS_KINDS[kind]
        )
        engine.ensure()
        started = time.perf_counter()
        for start in range(0, len(ids), WRITE_ROWS):
            stop = min(start + WRITE_ROWS, len(ids))
            engine.upsert(
                MilvusRows(
                    ids=ids[start:stop],
                    vectors=vectors[start:stop],
                    texts=texts[start:stop],
                    scope=SCOPE,
                    documents=(ids[start:stop] // 10).tolist(),
                )
            )
        insert = time.perf_counter() - started
        engine.client.flush(engine.name)
        settle(server)
        build = time.perf_counter() - started
        peak = peak_rss_bytes(server)
        engine.close()
        stop_milvus_lite(services.started[-1])

        # What a server holds for the built collection: a fresh one, loaded and queried.
        uri = start_milvus_lite(services, work / "engine")
        server = services.started[-1].process.pid
        engine = MilvusIndex(
            uri, name="bench_chunks", dimension=DIMENSION, index=MILVUS_KINDS[kind]
        )
        started = time.perf_counter()
        engine.ensure()
        load = time.perf_counter() - started
        settle(server)

        def dense(query: np.ndarray) -> list[Hit]:
            return engine.dense_search(query, 10, WHERE)

        def unfiltered(query: np.ndarray) -> list[Hit]:
            found = engine.client.search(
                engine.name,
                data=[query.tolist()],
                anns_field="dense",
                limit=10,
                output_fields=["id"],
                search_params={"metric_type": "IP", "params": engine._search_params(10)},
            )
            return [Hit(int(row["id"]), float(row["distance"])) for row in found[0]]

        def keyword(text: str) -> list[Hit]:
            return engine.keyword_search(keyword_query(text), 10, WHERE)

        row = query_figures(dense, queries, truth)
        engine_only = query_figures(unfiltered, queries, truth)
        bm25 = query_figures(keyword, keywords, None)
        resident = rss_bytes(server) - empty
        disk = folder_bytes(work / "engine")
        engine.close()
        size = len(ids)
        print(
            f"{'':>9} {kind}: insert {insert:.1f} s ({size / insert:,.0f} rows/s), then "
            f"flush and background index builds {build - insert:.1f} s; restarted server "
            f"loads in {load:.1f} s; server RSS empty {empty / 1e6:.0f} MB, peak while "
            f"building {peak / 1e6:.0f} MB",
            flush=True,
        )
        print(
            f"{'':>9} {kind} engine alone (MilvusClient.search, no filter): "
            f"p50 {engine_only['p50']:.2f} ms, p99 {engine_only['p99']:.2f} ms, "
            f"recall@10 {engine_only['recall']:.3f}; BM25 keyword search: "
            f"p50 {bm25['p50']:.2f} ms, p99 {bm25['p99']:.2f} ms",
            flush=True,
        )
        return {"build": build, "memory": disk, "rss": resident, **row}
    finally:
        services.stop_all()
        shutil.rmtree(work, ignore_errors=True)


def query_figures(
    search: Callable[[Any], list[Hit]], queries: Sequence[Any], truth: list[set[int]] | None
) -> dict[str, float]:
    """p50 and p99 in ms of ``search`` over ``queries`` one at a time, after 20 warm-up
    ones, and its recall@10 against ``truth`` (0 without one)."""
    for query in queries[:20]:
        search(query)
    latencies, found = [], []
    for query in queries:
        started = time.perf_counter()
        hits = search(query)
        latencies.append((time.perf_counter() - started) * 1000)
        found.append({hit.id for hit in hits})
    recall = (
        statistics.mean(len(f & t) / 10 for f, t in zip(found, truth, strict=True))
        if truth is not None
        else 0.0
    )
    return {
        "p50": statistics.median(latencies),
        "p99": percentile(latencies, 0.99),
        "recall": recall,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument(
        "--kinds",
        nargs="+",
        default=["flat", "hnsw", "ivf", "milvus-hnsw"],
        choices=["flat", "hnsw", "ivf", *MILVUS_KINDS],
    )
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--words", type=int, default=20, help="words per chunk text (Milvus)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ivf-probes", type=int, nargs="*", default=[], help="also measure ivf at these nprobe"
    )
    parser.add_argument(
        "--hnsw-beams", type=int, nargs="*", default=[], help="also hnsw at these efSearch"
    )
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    print(f"faiss {faiss.__version__}; cpus {os.cpu_count()}; build threads {args.threads}")
    rng = np.random.default_rng(args.seed)
    centres = rng.standard_normal((CENTRES, DIMENSION)).astype(np.float32)
    results: dict[tuple[int, str], dict[str, float]] = {}
    header = f"{'size':>9} {'kind':<11} {'build s':>9} {'file MB':>8} {'RSS MB':>8}"
    header += f" {'B/vec':>7} {'p50 ms':>8} {'p99 ms':>8} {'recall@10':>10}"
    print(header)
    for size in args.sizes:
        vectors = clustered(rng, centres, size)
        queries = clustered(rng, centres, args.queries)
        ids = np.arange(size, dtype=np.int64) * 7 + 3
        set_search_threads(args.threads)
        exact = VectorIndex.build(DIMENSION, "flat", ids=ids, vectors=vectors)
        set_search_threads(1)
        truth = [{hit.id for hit in row} for row in exact.search(queries, 10)]
        del exact
        texts: list[str] = []
        keywords: list[str] = []
        if any(kind in MILVUS_KINDS for kind in args.kinds):
            texts = synthetic_texts(size, words=args.words, seed=args.seed + size)
            picked = np.random.default_rng(args.seed + size).integers(0, size, args.queries)
            keywords = [" ".join(texts[i].split()[:4]) for i in picked]
        for kind in args.kinds:
            if kind in MILVUS_KINDS:
                row = measure_milvus(
                    kind,
                    ids,
                    vectors,
                    texts=texts,
                    queries=queries,
                    truth=truth,
                    keywords=keywords,
                )
            else:
                row = measure(
                    kind,
                    ids,
                    vectors,
                    queries=queries,
                    truth=truth,
                    threads=args.threads,
                    sweep={"ivf": args.ivf_probes, "hnsw": args.hnsw_beams},
                )
            results[(size, kind)] = row
            print(
                f"{size:>9} {kind:<11} {row['build']:>9.1f} {row['memory'] / 1e6:>8.0f} "
                f"{row['rss'] / 1e6:>8.0f} {row['rss'] / size:>7.0f} {row['p50']:>8.2f} "
                f"{row['p99']:>8.2f} {row['recall']:>10.3f}",
                flush=True,
            )
        del vectors, texts

    print(
        f"\nauto (the default) is flat below {AUTO_HNSW_FROM:,} vectors, hnsw from "
        f"{AUTO_HNSW_FROM:,}, ivf from {AUTO_IVF_FROM:,} (an explicit ivf is flat below "
        f"{IVF_MIN_SIZE:,}); ivf at 10M: nlist {ivf_lists(10_000_000)}, "
        f"nprobe {ivf_probes(ivf_lists(10_000_000))}"
    )
    largest = max(args.sizes)
    target = 10_000_000
    for kind in args.kinds:
        row = results.get((largest, kind))
        if row is None or kind in MILVUS_KINDS:  # Milvus Lite is not an engine for 10M
            continue
        scale = target / largest
        build = row["build"] * scale
        query = row["p50"] * scale
        if kind == "hnsw":
            build *= math.log(target) / math.log(largest)
            query = row["p50"] * math.log(target) / math.log(largest)
        if kind == "ivf":
            # Cells scanned grow as nprobe / nlist of n, plus the coarse search over nlist.
            before = ivf_probes(ivf_lists(largest)) / ivf_lists(largest)
            after = ivf_probes(ivf_lists(target)) / ivf_lists(target)
            query = row["p50"] * scale * after / before
        print(
            f"10M {kind:<5} (extrapolated from {largest:,}): build ~{build / 60:.0f} min, "
            f"memory ~{row['memory'] * scale / 1e9:.1f} GB, p50 ~{query:.1f} ms"
        )
    load_after = os.getloadavg()
    print(
        "load average (1, 5, 15 min): before "
        + " ".join(f"{v:.2f}" for v in load_before)
        + ", after "
        + " ".join(f"{v:.2f}" for v in load_after)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
