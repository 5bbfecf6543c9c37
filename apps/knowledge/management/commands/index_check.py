from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services import collection_index_rebuild, index_store
from retrieval import IndexCorrupted


class Command(BaseCommand):
    help = "Compare each collection's index with the database; --repair rebuilds on drift."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--repair", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        store = index_store()
        drifted = 0
        for collection in Collection.objects.select_related("team").order_by("pk"):
            expected = Chunk.objects.filter(
                collection=collection, document__status=Document.Status.INDEXED
            ).count()
            try:
                actual: int | str = len(
                    store.load_copy(collection.index_key, collection.index_version)
                )
            except IndexCorrupted as exc:
                actual = f"unreadable ({exc})"
            if actual == expected:
                self.stdout.write(
                    f"ok     {collection.team.name}/{collection.name}: {expected} vectors"
                )
                continue
            drifted += 1
            name = f"{collection.team.name}/{collection.name}"
            self.stdout.write(f"DRIFT  {name}: index {actual}, database {expected}")
            if options["repair"]:
                collection_index_rebuild(collection_id=collection.pk)
                self.stdout.write(f"       rebuilt from {expected} stored vectors")
        if drifted and not options["repair"]:
            raise CommandError(f"{drifted} collection(s) drifted; run with --repair")
