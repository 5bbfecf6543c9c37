from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.files import File
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from apps.accounts.selectors import team_get_by_name
from apps.core.exceptions import ApplicationError
from apps.knowledge.models import Collection, Document
from apps.knowledge.services import (
    collection_create,
    document_create_from_file,
    document_ingest,
    ingestion_enqueue,
)
from retrieval.parsing import MEDIA_TYPES


class Command(BaseCommand):
    help = "Bulk-load files (txt, md, html, pdf; folders are walked) into a team's collection."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="+", type=Path)
        parser.add_argument("--team", required=True)
        parser.add_argument("--collection", required=True, help="name; created when missing")
        parser.add_argument(
            "--queue",
            action="store_true",
            help="hand documents to the Celery workers instead of ingesting in this process",
        )
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handle(self, *args: Any, **options: Any) -> None:
        team = team_get_by_name(name=options["team"])
        if team is None:
            raise CommandError(f"no team named {options['team']!r}; create it with createteam")
        collection = Collection.objects.filter(team=team, name=options["collection"]).first()
        if collection is None:
            collection = collection_create(team=team, name=options["collection"])
        files = sorted(_walk(options["paths"]))
        if not files:
            raise CommandError("no txt, md, html or pdf files under the given paths")
        counts = {"indexed": 0, "existing": 0, "queued": 0, "failed": 0}
        with tqdm(files, unit="doc", disable=options["no_progress"], file=self.stderr) as bar:
            for path in bar:
                bar.set_postfix_str(path.name[-40:])
                counts[self._load(collection, path, queue=options["queue"])] += 1
        summary = ", ".join(f"{value} {key}" for key, value in counts.items() if value)
        self.stdout.write(f"{collection.name}: {summary}")
        if counts["failed"]:
            raise CommandError(f"{counts['failed']} document(s) failed")

    def _load(self, collection: Collection, path: Path, *, queue: bool) -> str:
        try:
            with path.open("rb") as handle:
                accepted = document_create_from_file(
                    collection=collection, upload=File(handle, name=path.name), enqueue=False
                )
        except ApplicationError as exc:
            self.stderr.write(f"{path}: {exc.message}")
            return "failed"
        document = accepted.document
        if not accepted.created and document.status == Document.Status.INDEXED:
            return "existing"
        if queue:
            ingestion_enqueue(document=document)
            return "queued"
        document = document_ingest(document_id=document.pk)
        if document.status != Document.Status.INDEXED:
            self.stderr.write(f"{path}: {document.error}")
            return "failed"
        return "indexed"


def _walk(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(
                p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in MEDIA_TYPES
            )
        elif path.is_file():
            found.append(path)
        else:
            raise CommandError(f"{path} does not exist")
    return found
