from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.knowledge.backends import BACKENDS, index_backend
from apps.knowledge.models import Collection
from apps.knowledge.services import collection_index_rebuild


class Command(BaseCommand):
    help = (
        "Move collections' indexes to another backend (faiss or milvus) while searches go "
        "on: each collection is rebuilt in the target from what its chunks keep, holding "
        "its row (its writes wait; its searches read the old index until the row moves), "
        "then, once every collection has moved and --grace seconds have passed, the old "
        "indexes are dropped. New collections follow VECTOR_BACKEND: set it too."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--to", required=True, choices=sorted(BACKENDS))
        parser.add_argument(
            "--collection", type=int, action="append", help="only this collection (repeatable)"
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=5.0,
            help="seconds to wait before dropping the old indexes (searches that read a "
            "collection's row before it moved finish against the old one)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        target = options["to"]
        collections = Collection.objects.exclude(index_backend=target).order_by("pk")
        if options["collection"]:
            collections = collections.filter(pk__in=options["collection"])
        moved: list[tuple[str, int, int]] = []
        for collection in collections.select_related("team"):
            started, source = time.monotonic(), collection.index_backend
            try:
                collection_index_rebuild(collection_id=collection.pk, backend=target)
            except Collection.DoesNotExist:
                continue  # deleted meanwhile
            moved.append((source, collection.team_id, collection.pk))
            self.stdout.write(
                f"moved  {collection.team.name}/{collection.name}: {source} -> {target} "
                f"({time.monotonic() - started:.1f} s)"
            )
        if not moved:
            self.stdout.write(f"every collection is on {target}")
            return
        time.sleep(max(0.0, options["grace"]))
        failed = 0
        for source, team_id, collection_id in moved:
            try:
                index_backend(source).drop(team_id=team_id, collection_id=collection_id)
            except Exception as exc:
                failed += 1
                self.stderr.write(f"collection {collection_id}: old {source} index kept ({exc})")
        self.stdout.write(f"{len(moved)} collection(s) on {target}; old indexes dropped")
        if failed:
            raise CommandError(f"{failed} old index(es) kept; index_check --repair removes them")
