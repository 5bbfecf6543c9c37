from __future__ import annotations

from typing import Any

import numpy as np
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services import (
    collection_index_rebuild,
    collection_index_sweep,
    index_state,
    index_store,
)
from retrieval import IndexCorrupted, SegmentedIndex


class Command(BaseCommand):
    help = (
        "Compare each collection's live index segments (vectors and keywords) with the "
        "database and list orphan segment files; --repair rebuilds on drift and deletes "
        "the orphans."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--repair", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        store = index_store()
        drifted = 0
        for collection in Collection.objects.select_related("team").order_by("pk"):
            expected = set(
                Chunk.objects.filter(
                    collection=collection, document__status=Document.Status.INDEXED
                ).values_list("pk", flat=True)
            )
            state = index_state(collection)
            name = f"{collection.team.name}/{collection.name}"
            vectors: str | None
            keywords: str | None
            try:
                live = store.read_state(collection.index_key, state)
            except IndexCorrupted as exc:
                vectors = keywords = f"unreadable ({exc})"
            else:
                vectors = _compare(live.ids(), expected)
                keywords = _compare(_keyword_ids(live), expected)
            orphans = store.orphans(collection.index_key, state)
            if vectors is None and keywords is None and not orphans:
                self.stdout.write(
                    f"ok     {name}: {len(expected)} vectors, {len(expected)} keyword entries "
                    f"({len(state.deltas)} deltas)"
                )
                continue
            drifted += 1
            self.stdout.write(
                f"DRIFT  {name}: vector index {vectors or 'ok'}, "
                f"keyword index {keywords or 'ok'}, database {len(expected)}, "
                f"{len(orphans)} orphan file(s)"
            )
            if not options["repair"]:
                continue
            if vectors is not None or keywords is not None:
                collection_index_rebuild(collection_id=collection.pk)
                self.stdout.write(
                    f"       rebuilt from {len(expected)} stored chunks (vectors and keywords)"
                )
            removed = collection_index_sweep(collection_id=collection.pk)
            if removed:
                self.stdout.write(f"       removed {len(removed)} orphan file(s)")
        if drifted and not options["repair"]:
            raise CommandError(f"{drifted} collection(s) drifted; run with --repair")


def _keyword_ids(index: SegmentedIndex) -> np.ndarray:
    """The ids the keyword side holds live (each segment's postings minus its dead)."""
    parts = [
        ids[~np.isin(ids, dead)]
        for ids, dead in (
            (segment.keywords.ids(), dead)
            for segment, dead in zip(index.segments, index.dead, strict=True)
        )
    ]
    return np.concatenate(parts)


def _compare(held_ids: np.ndarray, expected: set[int]) -> str | None:
    """None when the index holds exactly the expected chunk ids, else what is wrong."""
    held = [int(pk) for pk in held_ids]
    if len(held) == len(expected) and set(held) == expected:
        return None
    missing, extra = len(expected - set(held)), len(set(held) - expected)
    return f"{len(held)} (missing {missing}, extra {extra})"
