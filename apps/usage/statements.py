"""The database store's admission and settlement statements, each written once as SQL.

Reserving and settling on the database store run a handful of one-row statements, and
on SQLite every one of them runs under the one writer (:mod:`apps.core.group_commit`),
so their cost is what 32 requests at once queue on. Built by the ORM, each statement
cost many times what SQLite takes to run it (docs/gateway.md, admission). Here each is a
string made once per process, run on the driver's cursor (see :func:`_run`), and every
value is prepared by its model field (``get_db_prep_value``), so SQLite and PostgreSQL get
what the ORM would send them.
Portable SQL only: ``CASE`` for the clamps (SQLite has no ``GREATEST``), ``RETURNING``
(PostgreSQL, SQLite 3.35+). What happens once per limit or period (a counter's first
row) stays with the ORM, in :mod:`apps.usage.budgets` and :mod:`apps.usage.limiters`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, date, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from apps.core.fields import column_of
from apps.usage.models import QuotaCounter, Reservation, StreamCounter, TokenBucket


def _db() -> BaseDatabaseWrapper:
    """This thread's connection (what the ORM and the one writer use), looked up once per
    statement: each attribute read through ``django.db.connection`` looks it up again."""
    return connections[DEFAULT_DB_ALIAS]


def _prep(db: BaseDatabaseWrapper, model: type[models.Model], name: str, *, value: object) -> Any:
    field = model._meta.get_field(name)
    if not isinstance(field, models.Field):
        raise ImproperlyConfigured(f"{model.__name__}.{name} is not a concrete field")
    return field.get_db_prep_value(value, db)


@functools.cache
def _sql(vendor: str, mark: str) -> dict[str, str]:
    """Every statement, for one database vendor (names quoted its way), with ``mark`` for
    placeholder."""
    connection = _db()
    quote = connection.ops.quote_name
    counter, bucket = quote(QuotaCounter._meta.db_table), quote(TokenBucket._meta.db_table)
    streams, reservation = quote(StreamCounter._meta.db_table), quote(Reservation._meta.db_table)
    fields = _reservation_fields()
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    statements = {
        "charge": f"UPDATE {counter} SET used = used + %s WHERE id = %s AND used <= %s",
        "charge_key": (
            f"UPDATE {counter} SET used = used + %s WHERE id = %s AND used <= %s "
            "AND limit_id = %s AND period = %s AND starts_on = %s AND unit = %s"
        ),
        "record": (
            f"UPDATE {counter} SET used = used + %s "
            "WHERE limit_id = %s AND period = %s AND starts_on = %s AND unit = %s"
        ),
        "refund": (
            f"UPDATE {counter} SET used = CASE WHEN used > %s THEN used - %s ELSE 0 END "
            "WHERE id IN ({ids})"
        ),
        "bucket": f"SELECT id, level, refilled_at FROM {bucket} WHERE limit_id = %s{lock}",
        "bucket_set": f"UPDATE {bucket} SET level = %s, refilled_at = %s WHERE id = %s",
        "bucket_refund": (
            f"UPDATE {bucket} SET level = CASE WHEN level + %s > %s THEN %s ELSE level + %s END "
            "WHERE limit_id = %s"
        ),
        "slot_take": f"UPDATE {streams} SET open = open + 1 WHERE limit_id = %s AND open < %s",
        "slots_free": (
            f"UPDATE {streams} SET open = CASE WHEN open > 0 THEN open - 1 ELSE 0 END "
            "WHERE limit_id IN ({ids})"
        ),
        "insert": (
            f"INSERT INTO {reservation} ({', '.join(quote(column_of(f)) for f in fields[1:])}) "
            f"VALUES ({', '.join(['%s'] * (len(fields) - 1))}) RETURNING id"
        ),
        "insert_keyed": (
            f"INSERT INTO {reservation} ({', '.join(quote(column_of(f)) for f in fields)}) "
            f"VALUES ({', '.join(['%s'] * len(fields))}) ON CONFLICT DO NOTHING"
        ),
        "claim": (
            f"UPDATE {reservation} SET settled_at = %s, actual_tokens = %s, "
            "actual_cost_nanos = %s, remote_pending = %s "
            "WHERE id = %s AND token = %s AND settled_at IS NULL RETURNING tokens, cost_nanos"
        ),
    }
    return {name: sql.replace("%s", mark) for name, sql in statements.items()}


def _run(db: BaseDatabaseWrapper, name: str, params: Sequence[Any], *, ids: int = 0) -> Any:
    """Run statement ``name``; the cursor's rows, or how many it changed.

    On the driver's own cursor, inside the ORM's transaction: Django's cursor wrapper (its
    thread, async and debug checks, and SQLite's placeholder rewrite, per statement) cost
    a large share of a reserve or a settle on SQLite, nine statements between them
    (docs/gateway.md, admission). Failures are still the ORM's
    ``DatabaseError``. Where queries are logged (``DEBUG``, a test counting them), the
    ORM's cursor runs them, so that they are seen."""
    logged = db.queries_logged
    mark = "?" if db.vendor == "sqlite" and not logged else "%s"  # the driver's own, or Django's
    sql = _sql(db.vendor, mark)[name]
    if ids:
        sql = sql.replace("{ids}", ", ".join([mark] * ids))
    if db.connection is None:  # this thread's first statement
        db.ensure_connection()
    with db.wrap_database_errors:
        cursor = db.cursor() if logged else db.connection.cursor()
        try:
            cursor.execute(sql, params)
            if cursor.description is not None:
                return cursor.fetchall()
            return cursor.rowcount
        finally:
            cursor.close()


# -- quotas


def quota_charge(counter_id: int, *, tokens: int, room: int, key: Any = None) -> bool:
    """Add ``tokens`` (or nano-dollars) to a quota counter if its ``used`` is at most
    ``room``; with ``key`` (a :class:`~apps.usage.limiters.QuotaKey`), only if the row is
    still that quota's."""
    db = _db()
    if key is None:
        return bool(_run(db, "charge", [tokens, counter_id, room]))
    starts_on = _prep(db, QuotaCounter, "starts_on", value=key.starts_on)
    params = [tokens, counter_id, room, key.limit_id, key.period, starts_on, key.unit]
    return bool(_run(db, "charge_key", params))


def quota_record(key: Any, *, tokens: int) -> bool:
    """Add ``tokens`` (or nano-dollars) to a quota's counter, found by its key; False if it
    has no row yet."""
    db = _db()
    starts_on = _prep(db, QuotaCounter, "starts_on", value=key.starts_on)
    return bool(_run(db, "record", [tokens, key.limit_id, key.period, starts_on, key.unit]))


def quota_refund(counter_ids: Sequence[int], *, tokens: int) -> None:
    """Take ``tokens`` off each counter (never below zero; a negative amount charges)."""
    if counter_ids:
        _run(_db(), "refund", [tokens, tokens, *counter_ids], ids=len(counter_ids))


# -- buckets and stream slots


def bucket_row(limit_id: int) -> tuple[int, int, datetime] | None:
    """A bucket's id, level and last refill, locked where the database locks rows."""
    rows = _run(_db(), "bucket", [limit_id])
    if not rows:
        return None
    pk, level, refilled_at = rows[0]
    return pk, level, _aware(refilled_at)


def bucket_set(pk: int, *, level: int, refilled_at: datetime) -> None:
    db = _db()
    _run(db, "bucket_set", [level, _prep(db, TokenBucket, "refilled_at", value=refilled_at), pk])


def bucket_refund(limit_id: int, *, tokens: int, capacity: int) -> None:
    """Give ``tokens`` back to a bucket, up to its capacity."""
    _run(_db(), "bucket_refund", [tokens, capacity, capacity, tokens, limit_id])


def slot_take(limit_id: int, *, maximum: int) -> bool:
    """One more stream open under a limit, if fewer than ``maximum`` are (the counter's
    row must exist)."""
    return bool(_run(_db(), "slot_take", [limit_id, maximum]))


def slots_free(limit_ids: Sequence[int]) -> None:
    if limit_ids:
        _run(_db(), "slots_free", list(limit_ids), ids=len(limit_ids))


# -- reservations


def _reservation_fields() -> list[models.Field[Any, Any]]:
    """The primary key first, then the other columns."""
    fields = Reservation._meta.concrete_fields
    return [Reservation._meta.pk, *(f for f in fields if not f.primary_key)]


def reservation_insert(reservation: Reservation) -> None:
    """Insert ``reservation``. Without a key, its new key comes back into ``pk``; with one
    (taken ahead, see :mod:`apps.core.ids`), a row already there with it is left alone."""
    db = _db()
    fields = _reservation_fields()
    keyed = reservation.pk is not None
    values = [
        f.get_db_prep_save(getattr(reservation, f.attname), db) for f in fields[0 if keyed else 1 :]
    ]
    if keyed:
        _run(db, "insert_keyed", values)
    else:
        reservation.pk = _run(db, "insert", values)[0][0]
    reservation._state.adding = False


def reservation_claim(
    reservation: Reservation, *, now: datetime, actual: int, actual_cost: int = 0
) -> tuple[int, int] | None:
    """Mark an open reservation settled with ``actual`` tokens costing ``actual_cost``
    nano-dollars; the tokens and nano-dollars its row holds, or None if it was settled
    already (by anyone)."""
    db = _db()
    params = [
        _prep(db, Reservation, "settled_at", value=now),
        actual,
        actual_cost,
        False,
        reservation.pk,
        _prep(db, Reservation, "token", value=reservation.token),
    ]
    rows = _run(db, "claim", params)
    return (int(rows[0][0]), int(rows[0][1])) if rows else None


def _aware(value: datetime | str | date) -> datetime:
    """A datetime column as the ORM returns it (SQLite gives naive UTC, or text)."""
    if isinstance(value, str):
        parsed = parse_datetime(value)
        assert parsed is not None  # noqa: S101 - a datetime column
        value = parsed
    assert isinstance(value, datetime)  # noqa: S101
    if settings.USE_TZ and timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value
