"""Fusion of a dense and a keyword ranking into one: by rank, or by normalised score.

``rrf``: reciprocal rank fusion (Cormack, Clarke and Büttcher, SIGIR 2009). Each list gives
an item ``1 / (k + rank)`` (rank from 1); an item's fused score is the sum over the lists
that hold it. Only ranks count, so a cosine similarity and a BM25 score need no
normalisation. ``k = 60`` is the paper's value.

``minmax`` and ``zscore``: each list's scores are normalised (to [0, 1] by its minimum and
maximum, or to standard scores by its mean and deviation), then combined as
``alpha * dense + (1 - alpha) * keyword``. Unlike ranks, scores keep how far apart two
items are: a clear dense winner is not pulled level with a keyword near-miss. An item
missing from one list gets that list's floor (its lowest normalised score): it ranked
below everything the list returned.

Each list is read to ``fusion_depth(top_k)`` items, at least the policy's depth: an item
ranked moderately by both retrievers beats one ranked well by only one of them, which a
fusion of two top-5 lists could never see. The defaults were chosen on SciFact's dev
split (``bench/fusion_sweep.py``); the figures are in docs/retrieval.md.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from retrieval.hits import Hit

RRF_K = 60
FUSION_DEPTH = 100

FusionMethod = Literal["rrf", "minmax", "zscore"]
FUSION_METHODS: tuple[FusionMethod, ...] = get_args(FusionMethod)


@dataclass(frozen=True, slots=True)
class Normalised:
    """One list's normalised scores, and the floor an item missing from it gets."""

    scores: dict[int, float]
    floor: float


Normaliser = Callable[[Sequence[Hit]], Normalised]


@dataclass(frozen=True, slots=True)
class FusionPolicy:
    """How hybrid search fuses its two lists. ``alpha`` weighs the dense list (score
    fusions only); ``depth``: how deep each list is read at least; ``rrf_k``: RRF's k."""

    method: FusionMethod = "rrf"
    alpha: float = 0.5
    depth: int = FUSION_DEPTH
    rrf_k: int = RRF_K

    def __post_init__(self) -> None:
        if self.method not in FUSION_METHODS:
            raise ValueError(f"fusion method must be one of {FUSION_METHODS}, not {self.method!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"fusion alpha must be in [0, 1], not {self.alpha}")
        if self.depth < 1:
            raise ValueError(f"fusion depth must be >= 1, not {self.depth}")
        if self.rrf_k < 0:
            raise ValueError(f"k must be >= 0, not {self.rrf_k}")


def fusion_depth(top_k: int, depth: int = FUSION_DEPTH) -> int:
    """How deep each list is read to fuse the best ``top_k``."""
    return max(top_k, depth)


def fuse(
    dense: Sequence[Hit], keyword: Sequence[Hit], *, policy: FusionPolicy, limit: int | None = None
) -> list[Hit]:
    """``dense`` and ``keyword`` (each best first) fused as ``policy`` says, best first."""
    if policy.method == "rrf":
        return reciprocal_rank_fusion([dense, keyword], k=policy.rrf_k, limit=limit)
    normalise = min_max_scores if policy.method == "minmax" else z_scores
    return normalised_score_fusion(
        dense, keyword, alpha=policy.alpha, normalise=normalise, limit=limit
    )


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
    return _ordered(fused, limit)


def normalised_score_fusion(
    dense: Sequence[Hit],
    keyword: Sequence[Hit],
    *,
    alpha: float,
    normalise: Normaliser,
    limit: int | None = None,
) -> list[Hit]:
    """``alpha * dense + (1 - alpha) * keyword`` over each list's normalised scores, best
    first (equal scores by id). An item missing from a list gets that list's floor; an
    empty list adds nothing. Each ``Hit.score`` is the fused score."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], not {alpha}")
    first, second = normalise(dense), normalise(keyword)
    fused = {
        item: alpha * first.scores.get(item, first.floor)
        + (1.0 - alpha) * second.scores.get(item, second.floor)
        for item in first.scores.keys() | second.scores.keys()
    }
    return _ordered(fused, limit)


def min_max_scores(hits: Sequence[Hit]) -> Normalised:
    """Each item's score scaled to [0, 1] by the list's minimum and maximum (an item listed
    twice at its best); the floor is 0. A list whose scores are all equal cannot rank its
    members: each gets 1, so being found still counts against the floor of 0."""
    best = _best_scores(hits)
    if not best:
        return Normalised({}, 0.0)
    low, high = min(best.values()), max(best.values())
    if high == low:
        return _found_only(best)
    return Normalised({item: (score - low) / (high - low) for item, score in best.items()}, 0.0)


def z_scores(hits: Sequence[Hit]) -> Normalised:
    """Each item's standard score in the list (population deviation; an item listed twice
    at its best); the floor is the lowest of them. A list whose scores are all equal gives
    each member 1 and the floor 0, as :func:`min_max_scores` does."""
    best = _best_scores(hits)
    if not best:
        return Normalised({}, 0.0)
    # Plain float sums: statistics.pstdev computes exactly, in fractions, which costs more.
    mean = math.fsum(best.values()) / len(best)
    deviation = math.sqrt(math.fsum((score - mean) ** 2 for score in best.values()) / len(best))
    if deviation == 0:
        return _found_only(best)
    scores = {item: (score - mean) / deviation for item, score in best.items()}
    return Normalised(scores, min(scores.values()))


def _found_only(best: dict[int, float]) -> Normalised:
    return Normalised(dict.fromkeys(best, 1.0), 0.0)


def _best_scores(hits: Sequence[Hit]) -> dict[int, float]:
    best: dict[int, float] = {}
    for hit in hits:
        if hit.id not in best or hit.score > best[hit.id]:
            best[hit.id] = hit.score
    return best


def _ordered(fused: dict[int, float], limit: int | None) -> list[Hit]:
    """Best first, equal scores by id; only the best ``limit`` are sorted."""
    items = fused.items()
    if limit is None:
        ordered = sorted(items, key=_best_first)
    else:
        ordered = heapq.nsmallest(max(limit, 0), items, key=_best_first)
    return [Hit(item_id, score) for item_id, score in ordered]


def _best_first(item: tuple[int, float]) -> tuple[float, int]:
    return -item[1], item[0]
