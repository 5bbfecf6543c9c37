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

By document (``FusionPolicy.by_document``, given each chunk's document): a document's
score in a list is its best chunk's there, and the document's best chunk (by its own
fused score) takes the document's fused score. A document found by meaning in one chunk
and by words in another then counts both, as a document found by both in one chunk does;
its other chunks keep their own scores, so a long document cannot crowd out the rest.

Each list is read to ``fusion_depth(top_k)`` items, at least the policy's depth: an item
ranked moderately by both retrievers beats one ranked well by only one of them, which a
fusion of two top-5 lists could never see. The defaults were chosen on SciFact's dev
split (``bench/fusion_sweep.py``); the figures are in docs/retrieval.md.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
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
    fusions only); ``depth``: how deep each list is read at least; ``rrf_k``: RRF's k;
    ``by_document``: each document's best chunk carries the document's fused score."""

    method: FusionMethod = "rrf"
    alpha: float = 0.5
    depth: int = FUSION_DEPTH
    rrf_k: int = RRF_K
    by_document: bool = False

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
    dense: Sequence[Hit],
    keyword: Sequence[Hit],
    *,
    policy: FusionPolicy,
    limit: int | None = None,
    documents: Mapping[int, int] | None = None,
) -> list[Hit]:
    """``dense`` and ``keyword`` (each best first) fused as ``policy`` says, best first.

    ``documents``: each item's document, which a policy ``by_document`` needs (an item
    it does not name is a document of its own); ignored otherwise.
    """
    if policy.by_document and documents is None:
        raise ValueError("fusion by document needs each item's document")
    grouping = documents if policy.by_document else None
    if policy.method == "rrf":
        return reciprocal_rank_fusion(
            [dense, keyword], k=policy.rrf_k, limit=limit, documents=grouping
        )
    normalise = min_max_scores if policy.method == "minmax" else z_scores
    return normalised_score_fusion(
        dense, keyword, alpha=policy.alpha, normalise=normalise, limit=limit, documents=grouping
    )


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Hit]],
    *,
    k: int = RRF_K,
    limit: int | None = None,
    documents: Mapping[int, int] | None = None,
) -> list[Hit]:
    """The items of ``rankings`` (each best first) by fused score, best first.

    An item listed twice in one ranking counts at its best rank there. Equal fused scores
    break by id, so the order is deterministic. Each ``Hit.score`` is the fused score.
    With ``documents``, each document's best item takes the document's fused score
    (:func:`fuse`).
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, not {k}")
    parts: list[_Part] = []
    for ranking in rankings:
        reciprocal: dict[int, float] = {}
        for rank, hit in enumerate(ranking, start=1):
            reciprocal.setdefault(hit.id, 1.0 / (k + rank))
        parts.append(_Part(1.0, reciprocal, 0.0))
    return _ordered(_combined(parts, documents), limit)


def normalised_score_fusion(
    dense: Sequence[Hit],
    keyword: Sequence[Hit],
    *,
    alpha: float,
    normalise: Normaliser,
    limit: int | None = None,
    documents: Mapping[int, int] | None = None,
) -> list[Hit]:
    """``alpha * dense + (1 - alpha) * keyword`` over each list's normalised scores, best
    first (equal scores by id). An item missing from a list gets that list's floor; an
    empty list adds nothing. Each ``Hit.score`` is the fused score. With ``documents``,
    each document's best item takes the document's fused score (:func:`fuse`)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], not {alpha}")
    first, second = normalise(dense), normalise(keyword)
    parts = [
        _Part(alpha, first.scores, first.floor),
        _Part(1.0 - alpha, second.scores, second.floor),
    ]
    return _ordered(_combined(parts, documents), limit)


@dataclass(frozen=True, slots=True)
class _Part:
    """One list's share of a fused score: its weight, its items' scores, and what an item
    missing from it gets."""

    weight: float
    scores: dict[int, float]
    missing: float


def _combined(parts: Sequence[_Part], documents: Mapping[int, int] | None) -> dict[int, float]:
    """Each item's weighted sum over ``parts``; with ``documents``, each document's best
    item (equal scores by id) instead gets the weighted sum of the document's best score
    in each part, the item's own where it is the document's best there."""
    fused = dict.fromkeys(set().union(*(part.scores.keys() for part in parts)), 0.0)
    for part in parts:
        weight, scores, missing = part.weight, part.scores, part.missing
        for item in fused:
            fused[item] += weight * scores.get(item, missing)
    if documents is None:
        return fused
    leads: dict[int, int] = {}
    for item, score in fused.items():
        document = documents.get(item)
        if document is None:
            continue
        lead = leads.get(document)
        if lead is None or _best_first((item, score)) < _best_first((lead, fused[lead])):
            leads[document] = item
    best: list[dict[int, float]] = []
    for part in parts:
        by_document: dict[int, float] = {}
        for item, score in part.scores.items():
            document = documents.get(item)
            if document is not None and score > by_document.get(document, -math.inf):
                by_document[document] = score
        best.append(by_document)
    for document, lead in leads.items():
        fused[lead] = 0.0
        for part, found in zip(parts, best, strict=True):
            fused[lead] += part.weight * found.get(document, part.missing)
    return fused


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
