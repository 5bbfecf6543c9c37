"""What a caller asks of one answer: the one value :func:`.prepare.answer_prepare` takes.

Each surface's input serializer builds it (``InputSerializer.to_request``), so the answer
path reads no request body and neither surface spells out its fields. Frozen: preparing
an answer reads it, never changes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from apps.accounts.selectors import Caller
from apps.chat.services.registry import ModelChoice
from apps.knowledge.services import DEFAULT_SEARCH_MODE, SearchFilters, SearchMode
from inference import ChatMessage, Sampling, Tools

SAMPLING = "sampling"


def sampling_field(*, keyed: bool = True) -> Any:
    """A sampling parameter of :class:`AnswerRequest` (``temperature``, ``top_p``, …).
    None leaves the tier's default; a value set goes to the tier under the field's name
    (:attr:`AnswerRequest.tier_sampling`) and, unless it changes no output
    (``keyed=False``: ``user``), into the response cache's key
    (:attr:`AnswerRequest.sampling`)."""
    return field(default=None, metadata={SAMPLING: keyed})


@dataclass(frozen=True, slots=True, kw_only=True)
class AnswerRequest:
    """One question, with everything the caller chose about how it is answered: what it
    follows, what is searched, what is generated, what is kept."""

    caller: Caller
    model: ModelChoice
    """The alias named, or for ``auto`` the models it routes between."""
    content: str
    """The question: the last user message."""
    conversation: int | None = None
    """The id of one of the caller's conversations (another team's is a 404), or None for
    a new one, written with the messages."""
    history: tuple[ChatMessage, ...] | None = None
    """Replaces the conversation's stored turns (the OpenAI-compatible surface sends its
    own); None: the stored turns, if any."""
    instructions: str = ""
    """A client's system message: it follows the system prompt."""
    tail: tuple[ChatMessage, ...] = ()
    """A tool loop's turns after the question (the assistant's ``tool_calls``, the
    ``tool`` results): they follow it in the prompt, whole, after its passages."""
    tools: Tools | None = None
    """The functions the model may call (OpenAI's ``tools``, ``tool_choice``,
    ``parallel_tool_calls``), passed to the tier; a server that cannot take them is a 400."""

    rag: bool = True
    collection_ids: tuple[int, ...] | None = None
    """The collections searched; None: the conversation's, else every one the caller may
    read."""
    top_k: int = 5
    search_mode: SearchMode = DEFAULT_SEARCH_MODE
    search_filters: SearchFilters | None = None
    """``mode`` and ``filters`` of :func:`apps.knowledge.services.chunk_search`."""

    max_tokens: int | None = None
    want_reasoning: bool = False
    # Sampling parameters follow, one line each: ``name: type | None = sampling_field()``.
    temperature: float | None = sampling_field()
    top_p: float | None = sampling_field()
    stop: tuple[str, ...] | None = sampling_field()
    seed: int | None = sampling_field()
    presence_penalty: float | None = sampling_field()
    frequency_penalty: float | None = sampling_field()
    logit_bias: tuple[tuple[str, float], ...] | None = sampling_field()
    response_format: Mapping[str, Any] | None = sampling_field()
    user: str | None = sampling_field(keyed=False)
    logprobs: bool | None = sampling_field()
    top_logprobs: int | None = sampling_field()

    stream_grace: float | None = None
    """How long a streamed answer goes on for its client to resume it after a drop
    (seconds; None: ``STREAM_DETACH_GRACE``; 0: stopped at once)."""
    store: bool = True
    """False (a new conversation only): nothing of the exchange is kept but its usage row."""
    cache: bool = True
    """False skips the response cache; it applies only to single-turn questions."""

    @property
    def sampling(self) -> dict[str, Any]:
        """The sampling parameters the caller set that change the output, by name (empty:
        the tier's defaults): what the response cache keys on."""
        chosen = (
            (spec.name, getattr(self, spec.name))
            for spec in fields(self)
            if spec.metadata.get(SAMPLING)
        )
        return {name: value for name, value in chosen if value is not None}

    @property
    def tier_sampling(self) -> Sampling:
        """Every sampling parameter set, as the tier is asked for it."""
        chosen = (
            (spec.name, getattr(self, spec.name))
            for spec in fields(self)
            if SAMPLING in spec.metadata
        )
        return Sampling(**{name: value for name, value in chosen if value is not None})

    @property
    def deterministic(self) -> bool:
        """Whether the caller left the output as the deployment makes it or pinned it
        (``temperature`` 0, or a ``seed``): what the response cache may replay. A
        ``temperature`` above 0 without a seed asks for sampled output, which a replay
        would make the same every time."""
        return not self.temperature or self.seed is not None
