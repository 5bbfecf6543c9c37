"""Reciprocal rank fusion of ranked lists (Cormack, Clarke and Büttcher, SIGIR 2009).

Each list gives an item ``1 / (k + rank)`` (rank from 1); an item's fused score is the sum
over the lists that hold it. Only ranks count, so a cosine similarity and a BM25 score
need no normalisation to be combined. ``k = 60`` is the paper's value, fixed on principle
and not tuned here (least of all on the queries the bench reports).

Each list is read to ``fusion_depth(k)`` items, at least ``FUSION_DEPTH``: an item ranked
moderately by both retrievers beats one ranked well by only one of them, which a fusion of
two top-5 lists could never see.
"""

from __future__ import annotations

from collections.abc import Sequence

from retrieval.hits import Hit

RRF_K = 60
FUSION_DEPTH = 100


def fusion_depth(top_k: int) -> int:
    """How deep each list is read to fuse the best ``top_k``."""
    return max(top_k, FUSION_DEPTH)


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Hit]], *, k: int = RRF_K, limit: int | None = None
) -> list[Hit]:
    """The items of ``rankings`` (each best first) by fused score, best first.

    An item listed twice in one ranking counts at its best rank there. Equal fused scores
    break by id, so the order is deterministic. Each ``Hit.score`` is the fused score.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, not {k}")
    fused: dict[int, float] = {}
    for ranking in rankings:
        seen: set[int] = set()
        for rank, hit in enumerate(ranking, start=1):
            if hit.id in seen:
                continue
            seen.add(hit.id)
            fused[hit.id] = fused.get(hit.id, 0.0) + 1.0 / (k + rank)
    ordered = sorted(fused.items(), key=lambda item: (-item[1], item[0]))
    if limit is not None:
        ordered = ordered[: max(limit, 0)]
    return [Hit(item_id, score) for item_id, score in ordered]
