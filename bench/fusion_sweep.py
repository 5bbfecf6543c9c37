"""Choose hybrid search's defaults on SciFact's dev split: BM25 k1 and b, then the fusion.

What is swept
    1. BM25 ``k1`` x ``b`` for keyword search alone (nDCG@10, recall@100).
    2. With the best of those: RRF, and min-max and z-score fusion at each ``alpha`` (the
       dense list's weight), each list read to each candidate ``depth`` (chunks). The
       choice is the best nDCG@10 at the shallowest depth that comes within
       ``--tolerance`` of the best overall, since every search pays for its depth.
    3. Recall (issue 32): z-score fusion by document (each document's best chunk takes
       the document's fused score, ``FusionPolicy.by_document``) at each ``alpha`` and
       ``depth``, beside the rows of stage 2. A row replaces stage 2's choice only if it
       raises dev recall@100 and gives up no more than ``--tolerance`` of its nDCG@10;
       among those rows, stage 2's rule chooses.

    Every mode runs the pipeline of ``bench/retrieval_quality.py`` (the product's chunks,
    MiniLM in a flat FAISS index, the product's BM25 and fusion), and scores it the same
    way, from a search whose lists are read ``depth`` chunks deep. Only the dev split is
    read here (the test split is for reporting).

Run
    HF_HUB_OFFLINE=1 .venv/bin/python bench/fusion_sweep.py [--data DIR]

    ``--data`` defaults to ``../shared/data/scifact-dev``. Embeddings are cached as
    ``bench/retrieval_quality.py`` caches them. Prints one table per stage, then one JSON
    line: the chosen settings and their dev figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as ``python bench/fusion_sweep.py``
    sys.path.insert(0, str(REPO_ROOT))

import retrieval  # noqa: E402
from bench import retrieval_quality as quality  # noqa: E402

DEFAULT_DEV = Path("..") / "shared" / "data" / "scifact-dev"
K1S = (0.6, 0.9, 1.2, 1.5, 2.0)
BS = (0.3, 0.5, 0.75, 0.9)
ALPHAS = (0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7)
DEPTHS = (100, 200, 400, 700, 1000)

T = TypeVar("T")


def keyword_stage(
    run: quality.Pipeline, k1s: Sequence[float], bs: Sequence[float]
) -> list[tuple[retrieval.BM25Parameters, quality.Scores]]:
    """Keyword search alone at each (k1, b)."""
    rows = []
    for k1, b in itertools.product(k1s, bs):
        parameters = retrieval.BM25Parameters(k1=k1, b=b)
        rows.append((parameters, run.score_keyword(parameters)))
    return rows


def fusion_policies(alphas: Sequence[float], depths: Sequence[int]) -> list[retrieval.FusionPolicy]:
    policies = [retrieval.FusionPolicy(method="rrf", depth=depth) for depth in depths]
    for method in ("minmax", "zscore"):
        policies += [
            retrieval.FusionPolicy(method=method, alpha=alpha, depth=depth)
            for alpha, depth in itertools.product(alphas, depths)
        ]
    return policies


def by_document_policies(
    alphas: Sequence[float], depths: Sequence[int]
) -> list[retrieval.FusionPolicy]:
    return [
        retrieval.FusionPolicy(method="zscore", alpha=alpha, depth=depth, by_document=True)
        for alpha, depth in itertools.product(alphas, depths)
    ]


def best_of(rows: Sequence[tuple[T, quality.Scores]]) -> tuple[T, quality.Scores]:
    """The best nDCG@10; recall@100 breaks ties."""
    return max(rows, key=lambda row: (row[1].ndcg_at_10, row[1].recall_at_100))


def chosen_fusion(
    rows: Sequence[tuple[retrieval.FusionPolicy, quality.Scores]], *, tolerance: float
) -> tuple[retrieval.FusionPolicy, quality.Scores]:
    """The shallowest depth whose best row is within ``tolerance`` of the best nDCG@10
    (each list's depth is paid on every search), then its best row."""
    best = best_of(rows)[1].ndcg_at_10
    close = [row for row in rows if row[1].ndcg_at_10 >= best - tolerance]
    shallowest = min(policy.depth for policy, _ in close)
    return best_of([row for row in close if row[0].depth == shallowest])


def chosen_for_recall(
    rows: Sequence[tuple[retrieval.FusionPolicy, quality.Scores]],
    current: tuple[retrieval.FusionPolicy, quality.Scores],
    *,
    tolerance: float,
) -> tuple[retrieval.FusionPolicy, quality.Scores]:
    """``current`` unless a row has a higher recall@100 at no more than ``tolerance`` less
    nDCG@10; among such rows, :func:`chosen_fusion`'s rule."""
    scores = current[1]
    better = [
        row
        for row in rows
        if row[1].recall_at_100 > scores.recall_at_100
        and row[1].ndcg_at_10 >= scores.ndcg_at_10 - tolerance
    ]
    return chosen_fusion(better, tolerance=tolerance) if better else current


def print_keyword_table(rows: Sequence[tuple[retrieval.BM25Parameters, quality.Scores]]) -> None:
    print(f"{'k1':>5}  {'b':>5}  {'nDCG@10':>8}  {'recall@100':>10}")
    for parameters, scores in rows:
        print(
            f"{parameters.k1:>5.2f}  {parameters.b:>5.2f}  "
            f"{scores.ndcg_at_10:>8.4f}  {scores.recall_at_100:>10.4f}"
        )


def print_fusion_table(rows: Sequence[tuple[retrieval.FusionPolicy, quality.Scores]]) -> None:
    print(f"{'fusion':<11}  {'alpha':>5}  {'depth':>5}  {'nDCG@10':>8}  {'recall@100':>10}")
    for policy, scores in rows:
        alpha = "-" if policy.method == "rrf" else f"{policy.alpha:.2f}"
        method = f"{policy.method}/doc" if policy.by_document else policy.method
        print(
            f"{method:<11}  {alpha:>5}  {policy.depth:>5}  "
            f"{scores.ndcg_at_10:>8.4f}  {scores.recall_at_100:>10.4f}"
        )


def summary(
    bm25: retrieval.BM25Parameters,
    policy: retrieval.FusionPolicy,
    scores: dict[str, quality.Scores],
) -> dict[str, object]:
    """The chosen settings and each mode's dev figures: the sweep's last line."""
    return {
        "bm25": {"k1": bm25.k1, "b": bm25.b},
        "fusion": {
            "method": policy.method,
            "alpha": policy.alpha,
            "depth": policy.depth,
            "by_document": policy.by_document,
        },
        "ndcg_at_10": {mode: round(s.ndcg_at_10, 4) for mode, s in scores.items()},
        "recall_at_100": {mode: round(s.recall_at_100, 4) for mode, s in scores.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=(REPO_ROOT / DEFAULT_DEV).resolve())
    parser.add_argument(
        "--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "ragtier-bench-cache"
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.0025,
        help="nDCG@10 a shallower fusion depth may give up (default: 0.0025, about the "
        "noise of 400 queries)",
    )
    args = parser.parse_args(argv)
    run = quality.Pipeline.load(args.data, cache_dir=args.cache_dir)

    keyword_rows = keyword_stage(run, K1S, BS)
    print(f"\nBM25 alone on {args.data.name} ({len(run.query_ids)} queries):")
    print_keyword_table(keyword_rows)
    bm25, bm25_scores = best_of(keyword_rows)
    run.use_keyword(bm25)

    fusion_rows = [(policy, run.score_hybrid(policy)) for policy in fusion_policies(ALPHAS, DEPTHS)]
    print(f"\nhybrid with BM25 k1={bm25.k1}, b={bm25.b}:")
    print_fusion_table(fusion_rows)
    chosen = chosen_fusion(fusion_rows, tolerance=args.tolerance)
    print(f"\nstage 2 chooses {chosen[0]}: {chosen[1]}")

    document_rows = [
        (policy, run.score_hybrid(policy)) for policy in by_document_policies(ALPHAS, DEPTHS)
    ]
    print("\nz-score fusion by document, same BM25:")
    print_fusion_table(document_rows)
    policy, scores = chosen_for_recall(
        fusion_rows + document_rows, chosen, tolerance=args.tolerance
    )
    figures = {"dense": run.score_dense(), "keyword": bm25_scores, "hybrid": scores}
    print()
    print(json.dumps(summary(bm25, policy, figures)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
