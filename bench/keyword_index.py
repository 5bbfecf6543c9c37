"""What a collection's keyword index costs: build, write, read and search at 10k / 100k chunks.

What is measured
    What building a collection's whole keyword index costs (a rebuild or ``index_check
    --repair``; a document added writes a delta of its own chunks only, and compaction
    merges postings without tokenising again, see ``bench/index_write.py``):
    ``retrieval.KeywordIndex.build`` (tokenise with stop words and Snowball stems, then
    count the postings), ``write`` (atomic folder, fsynced) and ``read``,
    plus the query latency of ``search`` (p50 / p99, unfiltered and with a filter of 100
    allowed chunks) and the index's size on disk.

    Chunks are synthetic: ``--words`` words each (default 180, about a MiniLM chunk of 256
    word pieces), drawn from a Zipf distribution over a 50,000-word vocabulary, so that
    posting lengths look like a natural language's. The app adds to ``build`` the read of
    the collection's chunk texts from the database (``keyword_index_build``).

Run
    .venv/bin/python bench/keyword_index.py [--sizes 10000 100000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/keyword_index.py``
    sys.path.insert(0, str(REPO_ROOT))

from bench.harness import synthetic_texts  # noqa: E402
from retrieval import KeywordIndex  # noqa: E402

QUERIES = 200


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def folder_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.iterdir())


def measure(size: int, *, words: int, seed: int) -> dict[str, float]:
    texts = synthetic_texts(size, words=words, seed=seed)
    ids = np.arange(1, size + 1, dtype=np.int64)
    started = time.perf_counter()
    index = KeywordIndex.build(ids, texts)
    build = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "0000000001.bm25"
        started = time.perf_counter()
        index.write(path)
        write = time.perf_counter() - started
        started = time.perf_counter()
        KeywordIndex.read(path)
        read = time.perf_counter() - started
        disk = folder_bytes(path)
    rng = np.random.default_rng(seed + 1)
    queries = [" ".join(texts[i].split()[:6]) for i in rng.integers(0, size, QUERIES)]
    allowed = rng.choice(ids, size=100, replace=False)
    plain: list[float] = []
    filtered: list[float] = []
    for query in queries:
        started = time.perf_counter()
        index.search(query, 100)
        plain.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        index.search(query, 100, allowed=allowed)
        filtered.append((time.perf_counter() - started) * 1000)
    return {
        "build_s": build,
        "write_s": write,
        "read_s": read,
        "disk_mib": disk / 2**20,
        "search_p50_ms": statistics.median(plain),
        "search_p99_ms": percentile(plain, 0.99),
        "filtered_p50_ms": statistics.median(filtered),
        "filtered_p99_ms": percentile(filtered, 0.99),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--words", type=int, default=180, help="words per synthetic chunk")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    header = (
        f"{'chunks':>8}  {'build s':>8}  {'write s':>8}  {'read s':>7}  {'disk MiB':>8}  "
        f"{'search p50/p99 ms':>17}  {'filtered p50/p99 ms':>19}"
    )
    print(header)
    for size in args.sizes:
        m = measure(size, words=args.words, seed=args.seed)
        print(
            f"{size:>8,}  {m['build_s']:>8.2f}  {m['write_s']:>8.2f}  {m['read_s']:>7.2f}  "
            f"{m['disk_mib']:>8.1f}  "
            f"{m['search_p50_ms']:>8.2f}/{m['search_p99_ms']:<8.2f}  "
            f"{m['filtered_p50_ms']:>9.2f}/{m['filtered_p99_ms']:<9.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
