"""The three index kinds side by side: build time, memory, query latency, recall@10.

What is measured
    For each size (``--sizes``, default 100k and 1M) and kind (``--kinds``: flat, hnsw,
    ivf), ``retrieval.VectorIndex.build`` over synthetic 384-d unit vectors clustered
    around 1,000 random centres (embeddings cluster by topic; uniform noise is the one
    case no real corpus looks like), with chunk ids that are not positions:

    build      seconds to build (for ivf: k-means training on a sample, then adding).
    memory     bytes of the serialized index (faiss's own layout, which is what a
               process holds once it has read the file), in MB and bytes per vector.
    p50, p99   one query at a time (``VectorIndex.search(q, 10)``), ``--queries`` queries
               drawn from the same centres, after 20 warm-up queries, milliseconds.
    recall@10  share of flat's (exact) 10 best ids found, averaged over the queries.
    ``--ivf-probes`` and ``--hnsw-beams`` add the same query figures at other nprobe
    (ivf) and efSearch (hnsw) values.

    The last lines print the sizes at which ``VECTOR_INDEX_KIND=auto`` switches kind
    (``retrieval.index.kind_for_size``) and a 10M line extrapolated from the measured
    ones (flat and ivf scale linearly in n for build and memory, flat linearly for query
    time, ivf with nprobe / nlist; hnsw's build as n log n), marked as extrapolated.

How
    In one process, FAISS on ``--threads`` OpenMP threads (default: what the machine has,
    as a build would get; queries are single). Wall clock via ``time.perf_counter``; the
    1-, 5- and 15-minute load averages are printed before and after, since every figure
    here moves with what else the machine runs. Nothing is asserted.

Run
    .venv/bin/python bench/index_kinds.py [--sizes 100000 1000000] [--kinds flat hnsw ivf]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/index_kinds.py``
    sys.path.insert(0, str(REPO_ROOT))

from retrieval import VectorIndex, set_search_threads  # noqa: E402
from retrieval.index import (  # noqa: E402
    AUTO_HNSW_FROM,
    AUTO_IVF_FROM,
    IVF_MIN_SIZE,
    ivf_lists,
    ivf_probes,
)

DIMENSION = 384
CENTRES = 1000


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
    started = time.perf_counter()
    index = VectorIndex.build(DIMENSION, kind, ids=ids, vectors=vectors)  # type: ignore[arg-type]
    build = time.perf_counter() - started
    set_search_threads(1)  # ...queries come one at a time, one thread each (the app's)
    memory = len(faiss.serialize_index(index._raw))
    row = {"build": build, "memory": memory, **query_figures(index, queries, truth)}
    for value in sweep.get(kind, ()):
        if kind == "ivf":
            index._raw.nprobe = value
            label = f"nprobe {value:>5} of {index.lists}"
        else:
            faiss.downcast_index(index._raw.index).hnsw.efSearch = value
            label = f"efSearch {value:>5}"
        figures = query_figures(index, queries, truth)
        print(
            f"{'':>9} {kind} {label}: p50 {figures['p50']:.2f} ms, "
            f"p99 {figures['p99']:.2f} ms, recall@10 {figures['recall']:.3f}",
            flush=True,
        )
    return row


def query_figures(
    index: VectorIndex, queries: np.ndarray, truth: list[set[int]]
) -> dict[str, float]:
    for query in queries[:20]:
        index.search(query, 10)
    latencies, found = [], []
    for query in queries:
        started = time.perf_counter()
        hits = index.search(query, 10)[0]
        latencies.append((time.perf_counter() - started) * 1000)
        found.append({hit.id for hit in hits})
    recall = statistics.mean(len(f & t) / 10 for f, t in zip(found, truth, strict=True))
    return {
        "p50": statistics.median(latencies),
        "p99": percentile(latencies, 0.99),
        "recall": recall,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--kinds", nargs="+", default=["flat", "hnsw", "ivf"])
    parser.add_argument("--queries", type=int, default=300)
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
    header = f"{'size':>9} {'kind':<5} {'build s':>9} {'MB':>8} {'B/vec':>7}"
    header += f" {'p50 ms':>8} {'p99 ms':>8} {'recall@10':>10}"
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
        for kind in args.kinds:
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
                f"{size:>9} {kind:<5} {row['build']:>9.1f} {row['memory'] / 1e6:>8.0f} "
                f"{row['memory'] / size:>7.0f} {row['p50']:>8.2f} {row['p99']:>8.2f} "
                f"{row['recall']:>10.3f}",
                flush=True,
            )
        del vectors

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
        if row is None:
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
