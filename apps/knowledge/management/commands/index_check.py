from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services import collection_index_rebuild, index_store
from retrieval import IndexCorrupted, KeywordIndex, VectorIndex


class Command(BaseCommand):
    help = (
        "Compare each collection's vector and keyword indexes with the database; "
        "--repair rebuilds both on drift."
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
            key, version = collection.index_key, collection.index_version
            vectors = _compare(store.load_copy, key, version, expected)
            keywords = _compare(store.load_keyword_copy, key, version, expected)
            name = f"{collection.team.name}/{collection.name}"
            if vectors is None and keywords is None:
                self.stdout.write(
                    f"ok     {name}: {len(expected)} vectors, {len(expected)} keyword entries"
                )
                continue
            drifted += 1
            self.stdout.write(
                f"DRIFT  {name}: vector index {vectors or 'ok'}, "
                f"keyword index {keywords or 'ok'}, database {len(expected)}"
            )
            if options["repair"]:
                collection_index_rebuild(collection_id=collection.pk)
                self.stdout.write(
                    f"       rebuilt from {len(expected)} stored chunks (vectors and keywords)"
                )
        if drifted and not options["repair"]:
            raise CommandError(f"{drifted} collection(s) drifted; run with --repair")


def _compare(
    load: Callable[[str, int], VectorIndex | KeywordIndex],
    key: str,
    version: int,
    expected: set[int],
) -> str | None:
    """None when the index holds exactly the expected chunk ids, else what is wrong."""
    try:
        held = [int(pk) for pk in load(key, version).ids()]
    except IndexCorrupted as exc:
        return f"unreadable ({exc})"
    if len(held) == len(expected) and set(held) == expected:
        return None
    missing, extra = len(expected - set(held)), len(set(held) - expected)
    return f"{len(held)} (missing {missing}, extra {extra})"
