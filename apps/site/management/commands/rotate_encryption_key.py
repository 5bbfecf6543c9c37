from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.site.rotation import encryption_rotate


class Command(BaseCommand):
    help = (
        "Re-encrypt everything stored encrypted (messages, answer events, uploaded files, "
        "Redis event buffers) under the first of RAGTIER_ENCRYPTION_KEYS. Rotate by putting "
        "the new key first, running this, then removing the old key."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch", type=int, default=None, help="rows per transaction")

    def handle(self, *args: Any, **options: Any) -> None:
        def progress(what: str, done: int, total: int) -> None:
            self.stdout.write(f"{what}: {done}/{total}")

        count = encryption_rotate(progress=progress, batch=options["batch"])
        self.stdout.write(self.style.SUCCESS(f"re-encrypted {count} items"))
