"""The bench's Django: a fresh data folder on the embedded default, the team and key a run
answers as, and the PostgreSQL and Redis servers a run may be pointed at."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from io import StringIO
from pathlib import Path
from urllib.parse import urlsplit

REPO_ROOT = Path(__file__).resolve().parents[2]
TEAM = "bench"
COLLECTION = "ragtier-docs"
EMBEDDED_UNSET = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "STREAM_BUFFER_REDIS_URL")
"""Never a database, broker or Redis named by the environment: a run writes only its own."""


def django_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """This process's environment on the embedded default with ``data_dir`` as the data
    folder, ``extra`` on top (a ``DATABASE_URL`` there is the one run's own)."""
    env = dict(os.environ)
    for name in EMBEDDED_UNSET:
        env.pop(name, None)
    env.update(DJANGO_SETTINGS_MODULE="config.settings.base", RAGTIER_DATA_DIR=str(data_dir))
    env.setdefault("LOG_LEVEL", "WARNING")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(extra)
    return env


def service_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """``django_env`` for a subprocess: unbuffered output for its log, and no per-team
    request rate (one bench client stands in for many teams' clients)."""
    return django_env(
        data_dir,
        **{"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "REQUEST_RATE_PER_SECOND": "0", **extra},
    )


def start_django(env: Mapping[str, str], *, migrate: bool = False) -> None:
    """Make ``env`` this process's environment and start Django on it; must run before any
    app import."""
    os.environ.clear()
    os.environ.update(env)
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)


def setup_django(data_dir: Path, *, migrate: bool = False, **extra: str) -> None:
    """Django in this process on ``django_env(data_dir, **extra)``."""
    start_django(django_env(data_dir, **extra), migrate=migrate)


def setup_data(*, ingest: bool = True) -> tuple[str, str]:
    """Migrate, create the team and a key, ingest the demo corpus; (key, ingest summary).

    ``ingest=False`` skips the corpus (no embedding model loaded); the summary is then "".
    """
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("createteam", TEAM, stderr=StringIO())
    out = StringIO()
    call_command("createapikey", team=TEAM, stdout=out)
    if not ingest:
        return out.getvalue().strip(), ""
    summary = StringIO()
    call_command(
        "ingest",
        str(REPO_ROOT / "demo" / "corpus"),
        team=TEAM,
        collection=COLLECTION,
        no_progress=True,
        stdout=summary,
        stderr=StringIO(),
    )
    return out.getvalue().strip(), summary.getvalue().strip()


def check_postgres(database_url: str) -> str | None:
    """None when the server answers; otherwise why not."""
    import psycopg

    parts = urlsplit(database_url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        return f"--database-url must be a PostgreSQL URL, got {parts.scheme!r}"
    try:
        conn = psycopg.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5432,
            user=parts.username or "postgres",
            password=parts.password or None,
            dbname="postgres",
            connect_timeout=3,
        )
        conn.close()
    except Exception as exc:  # any failure means unreachable
        return f"PostgreSQL at {parts.hostname}:{parts.port or 5432} is unreachable: {exc}"
    return None


def check_redis(redis_url: str) -> str | None:
    import redis

    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=2).ping()
    except Exception as exc:
        return f"Redis at {redis_url} is unreachable: {exc}"
    return None


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """Create settings' PostgreSQL database (dropping a leftover one of the same name) and
    migrate it, with Django's test-database machinery; drop it at the end. Yields its name.
    """
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    name = settings.DATABASES["default"]["NAME"]
    settings.DATABASES["default"].setdefault("TEST", {})["NAME"] = name
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        yield name
    finally:
        connection.close()
        teardown_databases(old_config, verbosity=0)


def redis_cleanup(redis_url: str, prefix: str) -> int:
    import redis

    client = redis.Redis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=2)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    return len(keys)
