"""``Idempotency-Key`` on the POSTs that create (a message and its answer, a document).

The same key with the same request from the same team replays the first result: the same
message or document, an answer's events replayed rather than generated (and charged)
again. The same key with another request is 422 ``idempotency_key_reused``; while the
first is being served, 409 ``idempotency_in_progress``. Keys are scoped to the team and
remembered ``IDEMPOTENCY_KEY_TTL_SECONDS`` (24 h); a first request that failed releases
its key, so that a retry runs afresh.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.files import File
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.accounts.models import Team
from apps.core.aio import db_call
from apps.core.exceptions import IdempotencyInProgress, IdempotencyKeyReused, InvalidRequest
from apps.core.models import IdempotencyKey

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255


def idempotency_key_of(headers: Any) -> str | None:
    """The request's ``Idempotency-Key`` (1 to 255 printable ASCII characters), or None."""
    key = headers.get(HEADER)
    if key is None:
        return None
    if not (0 < len(key) <= MAX_KEY_LENGTH and key.isascii() and key.isprintable()):
        raise InvalidRequest(
            f"{HEADER} must be 1 to {MAX_KEY_LENGTH} printable ASCII characters.",
            code="invalid_value",
            param=HEADER,
        )
    return str(key)


def idempotency_fingerprint(*, method: str, path: str, body: Any) -> str:
    """A SHA-256 of the request: uploaded files count by their content's digest (a retried
    multipart body has a new boundary, not a new file)."""
    canonical = json.dumps(
        {"method": method, "path": path, "body": body},
        sort_keys=True,
        separators=(",", ":"),
        default=_canonical,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _canonical(value: Any) -> Any:
    if isinstance(value, File):
        digest = hashlib.sha256()
        for chunk in value.chunks():
            digest.update(chunk)
        value.seek(0)
        return {"file": value.name, "sha256": digest.hexdigest()}
    return str(value)


def idempotency_claim(
    *, team: Team, key: str, fingerprint: str, now: datetime | None = None
) -> IdempotencyKey:
    """The key claimed for this request (``running``: do the work, then
    :func:`idempotency_complete` or :func:`idempotency_release`), or the first request's
    completed claim (``complete``: replay its ``resource_id``).

    Raises 422 when the key came with another request, 409 while the first is served.
    The insert is the claim: of concurrent first requests, exactly one succeeds.
    """
    now = now or timezone.now()
    for _ in range(3):
        try:
            with transaction.atomic():
                return IdempotencyKey.objects.create(
                    team=team,
                    key=key,
                    fingerprint=fingerprint,
                    expires_at=now + timedelta(seconds=settings.IDEMPOTENCY_KEY_TTL_SECONDS),
                )
        except IntegrityError:
            pass
        first = IdempotencyKey.objects.filter(team=team, key=key).first()
        if first is None:
            continue  # released or purged meanwhile: claim it again
        if first.expires_at <= now or _stale(first, now):
            # Forgotten (or its process died): the one request that deletes it goes on.
            IdempotencyKey.objects.filter(pk=first.pk, status=first.status).delete()
            continue
        if first.fingerprint != fingerprint:
            raise IdempotencyKeyReused(
                f"This {HEADER} was used with another request; send a new key.", param=HEADER
            )
        if first.status == IdempotencyKey.Status.RUNNING:
            raise IdempotencyInProgress(
                f"A request with this {HEADER} is still being served; retry when it is done.",
                param=HEADER,
            )
        return first
    raise IdempotencyInProgress(
        f"A request with this {HEADER} is being served; retry shortly.", param=HEADER
    )


def idempotency_stale_after() -> timedelta:
    """How long a first request may stay ``running`` before it is taken to have died with
    its process (so that its key does not block retries for the rest of its 24 h):
    ``IDEMPOTENCY_STALE_SECONDS``, but never less than the longest an answer may live
    (its queue wait plus its total timeout), so a slow answer is never taken for dead."""
    longest_answer = settings.INFERENCE_QUEUE_TIMEOUT + settings.INFERENCE_TIMEOUTS["total"]
    return timedelta(seconds=max(settings.IDEMPOTENCY_STALE_SECONDS, longest_answer))


def _stale(claim: IdempotencyKey, now: datetime) -> bool:
    running_since = now - idempotency_stale_after()
    return claim.status == IdempotencyKey.Status.RUNNING and claim.created_at <= running_since


def idempotency_complete(
    *, claim: IdempotencyKey, resource_id: int, response_status: int
) -> IdempotencyKey:
    """The first request is done: later ones with its key replay ``resource_id``."""
    claim.status = IdempotencyKey.Status.COMPLETE
    claim.resource_id = resource_id
    claim.response_status = response_status
    IdempotencyKey.objects.filter(pk=claim.pk).update(
        status=claim.status, resource_id=resource_id, response_status=response_status
    )
    return claim


def idempotency_release(*, claim: IdempotencyKey) -> None:
    """The first request failed: forget the key, so that a retry runs afresh."""
    IdempotencyKey.objects.filter(pk=claim.pk).delete()


def idempotency_keys_purge_expired(*, now: datetime | None = None) -> int:
    """Delete keys past their time (and first requests that never finished)."""
    now = now or timezone.now()
    stale = now - idempotency_stale_after()
    expired = Q(expires_at__lte=now) | Q(
        status=IdempotencyKey.Status.RUNNING, created_at__lte=stale
    )
    deleted, _ = IdempotencyKey.objects.filter(expired).delete()
    return deleted


def idempotency_request_claim(*, request: Any, team: Team, body: Any) -> IdempotencyKey | None:
    """The claim of a request that sent ``Idempotency-Key`` (see :func:`idempotency_claim`),
    fingerprinted on its method, path and validated ``body``; None when it sent none."""
    key = idempotency_key_of(request.headers)
    if key is None:
        return None
    fingerprint = idempotency_fingerprint(method=request.method, path=request.path, body=body)
    return idempotency_claim(team=team, key=key, fingerprint=fingerprint)


async def idempotency_request_aclaim(
    *, request: Any, team: Team, body: Any
) -> IdempotencyKey | None:
    """:func:`idempotency_request_claim` from async code: a request with no
    ``Idempotency-Key`` (nearly all) costs no trip to the database pool."""
    if idempotency_key_of(request.headers) is None:
        return None
    return await db_call(idempotency_request_claim)(request=request, team=team, body=body)


@contextmanager
def idempotency_guard(claim: IdempotencyKey | None) -> Iterator[None]:
    """Releases ``claim`` if the work inside fails, so that a retry runs afresh."""
    try:
        yield
    except BaseException:
        if claim is not None:
            idempotency_release(claim=claim)
        raise
