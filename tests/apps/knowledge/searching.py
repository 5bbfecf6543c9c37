"""Search answers through the API, for tests that compare one index's answers with
another's."""

from __future__ import annotations

from collections.abc import Sequence

from rest_framework.test import APIClient

from apps.knowledge.models import Collection

MODES = ("hybrid", "dense", "keyword")
Answers = dict[str, list[list[tuple[int, float]]]]


def answers(
    api: APIClient,
    collection: Collection,
    queries: Sequence[str],
    *,
    modes: Sequence[str] = MODES,
    digits: int | None = None,
) -> Answers:
    """Every mode's ranked (chunk id, score) for every query, through the API; scores
    rounded to ``digits`` where given."""
    found: Answers = {}
    for mode in modes:
        found[mode] = []
        for query in queries:
            response = api.post(
                "/api/v1/search",
                {"query": query, "mode": mode, "top_k": 8, "collection_ids": [collection.pk]},
                format="json",
            )
            assert response.status_code == 200, response.content
            found[mode].append(
                [
                    (r["chunk_id"], r["score"] if digits is None else round(r["score"], digits))
                    for r in response.json()["results"]
                ]
            )
    return found
