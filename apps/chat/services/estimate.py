"""An answer's cost before the call (``POST /api/v1/estimate``): the prompt it would send
after retrieval and assembly, the most it may generate, what that costs at the routed
alias's prices, and whether every limit would admit it now.

The prompt is made by the answer's own steps (:func:`.prepare.answer_prepare_unheld`), so
its token count is the one the answer then records when the tier reports none, and the one
it holds. Whether the limits admit it is asked the way an answer asks, in the one
admission step: the whole hold reserved, then given back at once (never a second
reading of the counters that could disagree with the step an answer takes)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from apps.chat.services.prepare import PreparedAnswer, answer_prepare_unheld
from apps.chat.services.request import AnswerRequest
from apps.core.exceptions import ApplicationError
from apps.usage.budgets import budget_reserve, budget_settle, limits_cache
from apps.usage.services import cost_of


@dataclass(frozen=True)
class Estimate:
    prepared: PreparedAnswer
    cost_min: Decimal
    """The prompt alone (the answer may stop at its first token)."""
    cost_max: Decimal
    """The prompt and every output token ``max_tokens`` allows."""
    refusal: ApplicationError | None
    """What a limit would answer now (429, or 503 when its store is down); None: admitted."""


def answer_estimate(*, request: AnswerRequest) -> Estimate:
    prepared = answer_prepare_unheld(request=request)
    entry, prompt = prepared.spec.entry, prepared.prompt.prompt_tokens

    def cost(completion: int) -> Decimal:
        return cost_of(
            model=entry.alias, prompt=prompt, cached=0, completion=completion, price=entry.price
        )

    refusal = _admission(prepared)
    return Estimate(prepared, cost(0), cost(prepared.max_tokens), refusal)


def _admission(prepared: PreparedAnswer) -> ApplicationError | None:
    """What the answer's whole hold (its tokens, and their worst-case cost at the dearest
    price that may serve them) meets now."""
    caller = prepared.caller
    limits = limits_cache.get(team=caller.team, api_key=caller.api_key, tag=caller.tag)
    if not limits:
        return None
    try:
        reservation = budget_reserve(
            team=caller.team,
            api_key=caller.api_key,
            tokens=prepared.held,
            cost=prepared.held_cost,
            limits=limits,
        )
    except ApplicationError as exc:
        if exc.status in (429, 503):
            return exc
        raise
    budget_settle(reservation=reservation, actual=0)
    return None
