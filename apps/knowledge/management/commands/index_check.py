from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.knowledge.backends import BACKENDS, backend_of, index_backend
from apps.knowledge.models import Chunk, Collection, Document
from apps.knowledge.services import collection_index_rebuild


class Command(BaseCommand):
    help = (
        "Compare each collection's index (vectors and keywords, in its backend) with the "
        "database, and list leftovers (orphan segment files; engine chunks of deleted "
        "collections); --repair rebuilds on drift and removes the leftovers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--repair", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        drifted = 0
        collections = list(Collection.objects.select_related("team").order_by("pk"))
        for collection in collections:
            drifted += not self._check(collection, repair=options["repair"])
        for name in BACKENDS:
            leftovers = index_backend(name).leftovers(collections, repair=options["repair"])
            if leftovers:
                drifted += 1
                verb = "removed" if options["repair"] else "found"
                self.stdout.write(f"DRIFT  {name}: {verb} {leftovers} of deleted collections")
        if drifted and not options["repair"]:
            raise CommandError(f"{drifted} collection(s) drifted; run with --repair")

    def _check(self, collection: Collection, *, repair: bool) -> bool:
        """One collection's line; True when it is clean."""
        expected = set(
            Chunk.objects.filter(
                collection=collection, document__status=Document.Status.INDEXED
            ).values_list("pk", flat=True)
        )
        backend = backend_of(collection)
        drift = backend.drift(collection, expected)
        name = f"{collection.team.name}/{collection.name}"
        if drift.clean:
            deltas = collection.index_version - collection.index_base
            self.stdout.write(
                f"ok     {name}: {len(expected)} vectors, {len(expected)} keyword entries "
                f"({backend.name}, {deltas} deltas)"
            )
            return True
        self.stdout.write(
            f"DRIFT  {name}: vector index {drift.vectors or 'ok'}, "
            f"keyword index {drift.keywords or 'ok'}, database {len(expected)}, "
            f"{drift.leftovers} orphan file(s)"
        )
        if not repair:
            return False
        if drift.vectors is not None or drift.keywords is not None:
            collection_index_rebuild(collection_id=collection.pk)
            self.stdout.write(
                f"       rebuilt from {len(expected)} stored chunks (vectors and keywords)"
            )
        removed = backend.sweep(collection)
        if removed:
            self.stdout.write(f"       removed {removed} orphan file(s)")
        return False
