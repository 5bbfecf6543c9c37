"""GPU check for a lent accelerator: query embedding on CUDA and FAISS search on the GPU.

What is measured
    1. The query embedding: all-MiniLM-L6-v2 (the packaged one, or ``--model-path``) through
       ``retrieval.load_embedder`` with ``device="cuda"``, one query at a time (``--queries``),
       p50 / p99 ms, beside the same on the CPU in the same run; then ingestion's batch
       embedding (``--chunks`` chunks of ~200 tokens, the embedder's batch of 64), chunks/s on
       each device, and the largest difference between the CUDA and CPU vectors.
    2. The search: ``retrieval.VectorIndex`` (flat, the kind that moves to the GPU through
       ``faiss.index_cpu_to_all_gpus`` when ``faiss.get_num_gpus()`` > 0) over ``--size``
       (default 1M) synthetic unit 384-d vectors, one query at a time, p50 / p99 ms, beside
       the same index searched on the CPU, and whether both return the same ids.

    Each part says plainly when it cannot run: no CUDA device for torch, or a FAISS wheel
    without GPU support (``faiss-cpu``: ``get_num_gpus`` reports 0; ``faiss-gpu`` needs
    CUDA 12's cuBLAS, ~400 MB, beside it). The exit status is 0
    when both parts ran on the GPU, 2 otherwise.

Run (one short command; about a minute at 1M on one GPU)
    HF_HUB_OFFLINE=1 .venv/bin/python bench/gpu_check.py [--size 1000000] [--queries 200]
        [--chunks 4096] [--model-path FOLDER]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/gpu_check.py``
    sys.path.insert(0, str(REPO_ROOT))

DIMENSION = 384


def timed(call: Callable[[int], Any], count: int) -> tuple[float, float]:
    """p50 and p99 in ms of ``call(i)`` for i in range(count), after 10 warm-up calls."""
    for number in range(10):
        call(number)
    latencies = []
    for number in range(count):
        started = time.perf_counter()
        call(number)
        latencies.append((time.perf_counter() - started) * 1000)
    ordered = sorted(latencies)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * (count - 1)))]


def check_embedding(queries: int, chunks: int, model_path: str | None) -> bool:
    import torch

    from retrieval import load_embedder

    texts = [f"What does study {n} report about insulin resistance and sleep?" for n in range(64)]
    passage = " ".join(
        "Insulin resistance rose with short sleep in the cohort, after adjustment for age."
        for _ in range(12)
    )  # ~200 tokens, an ingestion chunk's size
    passages = [f"{n}. {passage}" for n in range(chunks)]
    if not torch.cuda.is_available():
        print("embedding: NO CUDA device visible to torch; the embedder runs on the CPU")
        return False
    print(f"embedding: torch {torch.__version__}, device {torch.cuda.get_device_name(0)}")
    vectors = {}
    for device in ("cuda", "cpu"):
        model = load_embedder(
            "retrieval.embedders.SentenceTransformerEmbedder", device=device, model_path=model_path
        )
        p50, p99 = timed(lambda n, m=model: m.embed([texts[n % len(texts)]]), queries)
        print(f"  query embedding on {device:<4}: p50 {p50:7.2f} ms  p99 {p99:7.2f} ms")
        model.embed(passages[:64])  # warm-up at the batch size
        count = chunks if device == "cuda" else min(chunks, 512)
        started = time.perf_counter()
        vectors[device] = model.embed(passages[:count]).vectors
        rate = count / (time.perf_counter() - started)
        print(f"  batch embedding on {device:<4}: {rate:9.0f} chunks/s ({count} chunks)")
    common = len(vectors["cpu"])
    drift = float(np.abs(vectors["cuda"][:common] - vectors["cpu"]).max())
    print(f"  largest |CUDA - CPU| over {common} vectors: {drift:.2e}")
    return True


def check_search(size: int, queries: int) -> bool:
    try:
        import faiss
    except ImportError as exc:
        print(f"search: NO FAISS here ({exc})")
        return False

    from retrieval import VectorIndex, gpu_count, set_search_threads

    gpus = gpu_count()
    has_gpu_build = hasattr(faiss, "StandardGpuResources")
    print(f"search: faiss {faiss.__version__}, GPUs seen by faiss {gpus}")
    if not has_gpu_build or gpus == 0:
        print(
            "search: NO FAISS GPU support here ("
            + ("this faiss wheel is CPU-only (faiss-cpu)" if not has_gpu_build else "no GPU")
            + "); searches stay on the CPU"
        )
        return False
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((size, DIMENSION), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    probes = rng.standard_normal((queries + 10, DIMENSION), dtype=np.float32)
    probes /= np.linalg.norm(probes, axis=1, keepdims=True)
    ids = np.arange(size, dtype=np.int64) * 3 + 1
    started = time.perf_counter()
    index = VectorIndex.build(
        DIMENSION, "flat", ids=ids, vectors=vectors
    )  # moved to the GPU in add()
    print(
        f"  {size:,} vectors: built and copied to the GPU in {time.perf_counter() - started:.1f} s"
    )
    on_gpu = index._searchable is not index._raw
    print(f"  VectorIndex searches on the GPU: {on_gpu}")
    set_search_threads(os.cpu_count() or 1)
    gpu_p50, gpu_p99 = timed(lambda n: index.search(probes[n], 10), queries)
    cpu = VectorIndex(DIMENSION, "flat", raw=index._raw)
    cpu._searchable = index._raw  # the same vectors, searched by the CPU
    cpu_p50, cpu_p99 = timed(lambda n: cpu.search(probes[n], 10), min(queries, 50))
    same = all(
        [h.id for h in index.search(probes[n], 10)[0]]
        == [h.id for h in cpu.search(probes[n], 10)[0]]
        for n in range(20)
    )
    print(f"  search on the GPU at {size:,}: p50 {gpu_p50:7.2f} ms  p99 {gpu_p99:7.2f} ms")
    print(f"  search on the CPU at {size:,}: p50 {cpu_p50:7.2f} ms  p99 {cpu_p99:7.2f} ms")
    print(f"  CPU / GPU p50: {cpu_p50 / gpu_p50:.1f}x; same top-10 ids: {same}")
    return on_gpu


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--chunks", type=int, default=4096, help="batch embedding on CUDA")
    parser.add_argument("--model-path", help="a sentence-transformers folder (default: packaged)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    embedded = check_embedding(args.queries, args.chunks, args.model_path)
    searched = check_search(args.size, args.queries)
    print(f"GPU check: embedding on GPU {embedded}, search on GPU {searched}")
    return 0 if embedded and searched else 2


if __name__ == "__main__":
    raise SystemExit(main())
