"""Search latency of the app against raw FAISS on the same vectors, one query at a time.

What is measured
    For each collection size (``--sizes``, default 10k and 100k vectors), per query:

    app        ``apps.knowledge.services.chunk_search`` with ``top_k=10`` and ``mode="dense"``
               (what the replica below does): reads the team's collections, embeds the
               query with the real all-MiniLM-L6-v2, records the embedding usage row,
               loads the collection's index from the per-process store, searches it and
               fetches the chunk rows (with their documents) from the DB.
    embed      the query embedding alone: ``embedder().embed([text])``.
    after      what ``chunk_search`` does besides embedding, replicated with the same calls on
               an already embedded query: collection read, usage row, ``collection_index_load``
               + search, ``Chunk.objects.select_related("document").in_bulk``. Its parts are
               timed too (collections, usage row, load + search, fetch).
    wrapper    ``retrieval.VectorIndex.search(vector, 10)`` on the very index object the app
               searched (FAISS plus the conversion to ``Hit`` objects).
    raw        FAISS ``index.search(vector, 10)`` on that object's underlying faiss index.

    The table gives median and p95 in milliseconds, and the median over rounds of the
    per-round ratios app/raw, (app - embed)/raw and after/raw, plus the ratio of medians.

How
    Django runs in-process on the embedded default settings (``config.settings.base``) with
    ``RAGTIER_DATA_DIR`` pointed at a fresh temp folder, so the database is a new SQLite file
    (``DATABASE_URL`` is ignored unless ``--database-url`` is given) and the index files live
    there too. Per size: a new team, a collection, one indexed Document row, N Chunk rows with
    random unit-norm float32 384-d vectors stored as bytes (bulk_create, ``--batch-size``),
    then ``collection_index_rebuild`` writes the FAISS index. After ``--warmup`` rounds (the
    first loads the model and the index) every round runs each measurement once, in the order
    above, with a different query text. Wall clock via ``time.perf_counter``; nothing is
    asserted. The temp folder is removed at the end unless ``--keep``.

Run
    HF_HUB_OFFLINE=1 .venv/bin/python bench/retrieval_latency.py
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/retrieval_latency.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import (  # noqa: E402
    Fixture,
    create_fixture,
    setup_django,
)

TOP_K = 10

_SUBJECTS = [
    "insulin resistance",
    "the FAISS flat index",
    "token bucket rate limits",
    "mitochondrial DNA",
    "vaccine efficacy",
    "a PostgreSQL replica",
    "the embedding model",
    "gut microbiota",
    "prefix caching in vLLM",
    "T cell exhaustion",
    "Celery retries",
    "sleep deprivation",
]
_ASKS = [
    "What is known about {s}?",
    "How does {s} affect {t}?",
    "Is there evidence that {s} causes {t}?",
    "Explain the relation between {s} and {t} in two sentences.",
    "{s} and {t}: summary of the findings",
    "Which studies measured {s} together with {t}, and what did they report?",
]


def query_texts(count: int, seed: int) -> list[str]:
    """``count`` varied query texts (short and long), reproducible from ``seed``."""
    rng = random.Random(seed)
    texts = []
    for number in range(count):
        s, t = rng.sample(_SUBJECTS, 2)
        texts.append(f"{rng.choice(_ASKS).format(s=s, t=t)} (#{number})")
    return texts


@dataclass
class Timings:
    samples: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.samples.setdefault(name, []).append(seconds * 1000.0)

    def median(self, name: str) -> float:
        return statistics.median(self.samples[name])

    def p95(self, name: str) -> float:
        values = sorted(self.samples[name])
        return values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]


def measure(fixture: Fixture, *, rounds: int, warmup: int, seed: int) -> Timings:
    from apps.accounts.selectors import Caller
    from apps.knowledge.models import Chunk
    from apps.knowledge.selectors import collection_list_readable
    from apps.knowledge.services import chunk_search, collection_index_load, embedder
    from apps.usage.services import usage_record_embedding
    from retrieval import Hit

    caller = Caller(fixture.team, None, None, frozenset({"read"}))
    model = embedder()

    def after_embedding(vector: npt.NDArray[np.float32], tokens: int, timings: Timings) -> int:
        """``chunk_search`` minus its ``embed`` call, step by step."""
        started = time.perf_counter()
        collections = collection_list_readable(team=caller.team, ids=None)
        t_collections = time.perf_counter()
        usage_record_embedding(
            team=caller.team,
            model=model.model_name,
            tokens=tokens,
            operation="query",
            api_key=caller.api_key,
            user=caller.user,
        )
        t_usage = time.perf_counter()
        hits: list[Hit] = []
        for collection in collections:
            if collection.index_version:
                index = collection_index_load(collection)
                hits.extend(index.search(vector, TOP_K)[0])
        hits.sort(key=lambda hit: hit.score, reverse=True)
        best = hits[:TOP_K]
        t_search = time.perf_counter()
        chunks = Chunk.objects.select_related("document").in_bulk([hit.id for hit in best])
        found = [
            hit
            for hit in best
            if hit.id in chunks and chunks[hit.id].document.team_id == caller.team.pk
        ]
        finished = time.perf_counter()
        timings.add("after", finished - started)
        timings.add("  collections", t_collections - started)
        timings.add("  usage row", t_usage - t_collections)
        timings.add("  load + search", t_search - t_usage)
        timings.add("  fetch rows", finished - t_search)
        return len(found)

    index = collection_index_load(fixture.collection)
    # The object VectorIndex.search calls into: the GPU copy when there is one, else the CPU one.
    base = index.segments[0].vectors
    raw_index: Any = getattr(base, "_searchable", None)
    if raw_index is None:
        raw_index = base._raw
    if len(index) != fixture.size:
        raise RuntimeError(f"index holds {len(index)} vectors, expected {fixture.size}")

    texts = query_texts(warmup + rounds, seed)
    timings = Timings()
    for number, text in enumerate(texts):
        round_timings = timings if number >= warmup else Timings()
        started = time.perf_counter()
        results = chunk_search(caller=caller, query=text, top_k=TOP_K, mode="dense")
        round_timings.add("app", time.perf_counter() - started)
        if len(results) != TOP_K:
            raise RuntimeError(f"chunk_search returned {len(results)} results, not {TOP_K}")

        started = time.perf_counter()
        embedded = model.embed([text])
        round_timings.add("embed", time.perf_counter() - started)
        vector = embedded.vectors

        found = after_embedding(vector, embedded.token_count, round_timings)
        if found != TOP_K:
            raise RuntimeError(f"the replica found {found} chunks, not {TOP_K}")

        started = time.perf_counter()
        index.search(vector, TOP_K)
        round_timings.add("wrapper", time.perf_counter() - started)

        started = time.perf_counter()
        raw_index.search(vector, TOP_K)
        round_timings.add("raw", time.perf_counter() - started)
    return timings


def ratio_median(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    return statistics.median(n / d for n, d in zip(numerator, denominator, strict=True))


def report(fixture: Fixture, timings: Timings) -> None:
    s = timings.samples
    print()
    print(
        f"== {fixture.size:,} vectors: insert {fixture.insert_seconds:.1f} s, "
        f"index rebuild {fixture.rebuild_seconds:.1f} s, {len(s['app'])} rounds"
    )
    labels = {
        "app": "(a) app: chunk_search",
        "embed": "    query embedding alone",
        "after": "(b) app after embedding",
        "  collections": "      collection read",
        "  usage row": "      usage row insert",
        "  load + search": "      index load + search",
        "  fetch rows": "      chunk rows fetch",
        "wrapper": "    VectorIndex.search",
        "raw": "(c) raw faiss index.search",
    }
    width = max(len(label) for label in labels.values())
    print(f"{'':<{width}}  {'median ms':>10}  {'p95 ms':>10}")
    for name, label in labels.items():
        print(f"{label:<{width}}  {timings.median(name):>10.3f}  {timings.p95(name):>10.3f}")
    app_minus_embed = [a - e for a, e in zip(s["app"], s["embed"], strict=True)]
    raw_median = timings.median("raw")
    print("ratios to raw faiss       median of per-round ratios   ratio of medians")
    rows = [
        ("app / raw", ratio_median(s["app"], s["raw"]), timings.median("app") / raw_median),
        (
            "(app - embed) / raw",
            ratio_median(app_minus_embed, s["raw"]),
            statistics.median(app_minus_embed) / raw_median,
        ),
        ("after / raw", ratio_median(s["after"], s["raw"]), timings.median("after") / raw_median),
        (
            "wrapper / raw",
            ratio_median(s["wrapper"], s["raw"]),
            timings.median("wrapper") / raw_median,
        ),
    ]
    for label, per_round, of_medians in rows:
        print(f"  {label:<24}  {per_round:>26.1f}x  {of_medians:>16.1f}x")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[10_000, 100_000], help="vectors per index"
    )
    parser.add_argument("--rounds", type=int, default=200, help="measured rounds per size")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured rounds first")
    parser.add_argument("--batch-size", type=int, default=5000, help="rows per bulk_create")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--database-url", default=None, help="use this database instead of a fresh SQLite file"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp data folder")
    args = parser.parse_args(argv)

    data_dir = Path(tempfile.mkdtemp(prefix="ragtier-bench-latency-"))
    try:
        # The exact index kind unless told otherwise, so that runs compare with earlier ones
        # (the product's default, auto, builds HNSW from 50k vectors).
        kind = os.environ.get("VECTOR_INDEX_KIND", "flat")
        database = {"DATABASE_URL": args.database_url} if args.database_url else {}
        setup_django(data_dir, migrate=True, VECTOR_INDEX_KIND=kind, **database)
        import faiss
        from django.conf import settings
        from django.db import connection

        from apps.knowledge.services import embedder

        model = embedder()
        print(
            f"data dir: {data_dir} ({connection.vendor}); index kind: {settings.VECTOR_INDEX_KIND}"
        )
        print(
            f"embedder: {model.model_name} on {getattr(model, 'device', '?')}; "
            f"faiss {faiss.__version__}, omp threads {faiss.omp_get_max_threads()}; "
            f"cpus {os.cpu_count()}"
        )
        for position, size in enumerate(args.sizes):
            fixture = create_fixture(size, batch_size=args.batch_size, seed=args.seed + position)
            timings = measure(fixture, rounds=args.rounds, warmup=args.warmup, seed=args.seed)
            report(fixture, timings)
    finally:
        if args.keep:
            print(f"kept {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
