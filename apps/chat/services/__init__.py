"""Writes for the chat app, one module per concern, re-exported here.

An answer is asked for (:mod:`.request`: one typed value, built by each surface),
prepared (:mod:`.prepare`: admission, retrieval, the prompt), run (:mod:`.run`: a slot at
the tier (:mod:`.tier`, the aliases of :mod:`.registry`), the stream of typed events from
:mod:`.types` (:mod:`.generate`), its events journalled for replay by :mod:`.journal`),
settled once (:mod:`.settle`: its messages, usage block and ledger row) and, for the
non-streaming surfaces, collected (:mod:`.collect`). A streamed native answer outlives a
dropped connection for a grace period (:mod:`.detach`); a replay follows an answer's
stored events (:mod:`.replay`), and resumes a detached one.
"""

from apps.chat.services.collect import CollectedAnswer, answer_collect
from apps.chat.services.conversations import (
    conversation_create,
    conversation_delete,
    message_cancel,
)
from apps.chat.services.detach import answer_outliving_client, detach_grace
from apps.chat.services.estimate import Estimate, answer_estimate
from apps.chat.services.generate import answer_events
from apps.chat.services.prepare import PreparedAnswer, answer_prepare
from apps.chat.services.registry import (
    ModelChoice,
    ModelSpec,
    model_alias_resolve,
    model_aliases,
    model_registry,
    text_count,
    tokenizer,
)
from apps.chat.services.replay import (
    ReplaySlot,
    StoredEvent,
    answer_text_so_far,
    message_events_follow,
    replay_follow,
    replay_open,
    replay_slot_take,
)
from apps.chat.services.request import AnswerRequest
from apps.chat.services.run import AnswerRun, answer_ready, answer_start
from apps.chat.services.teams import PurgeReport, team_purge
from apps.chat.services.tier import inference_client, model_choose, model_resolve
from apps.chat.services.types import AnswerEvent

__all__ = [
    "AnswerEvent",
    "AnswerRequest",
    "AnswerRun",
    "CollectedAnswer",
    "Estimate",
    "ModelChoice",
    "ModelSpec",
    "PreparedAnswer",
    "PurgeReport",
    "ReplaySlot",
    "StoredEvent",
    "answer_collect",
    "answer_estimate",
    "answer_events",
    "answer_outliving_client",
    "answer_prepare",
    "answer_ready",
    "answer_start",
    "answer_text_so_far",
    "conversation_create",
    "conversation_delete",
    "detach_grace",
    "inference_client",
    "message_cancel",
    "message_events_follow",
    "model_alias_resolve",
    "model_aliases",
    "model_choose",
    "model_registry",
    "model_resolve",
    "replay_follow",
    "replay_open",
    "replay_slot_take",
    "team_purge",
    "text_count",
    "tokenizer",
]
