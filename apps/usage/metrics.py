"""Prometheus metrics, correct across several ASGI and Celery worker processes.

With ``PROMETHEUS_MULTIPROC_DIR`` set (``runstack`` and docker-compose set it), each
process writes its samples to files there and ``/metrics`` aggregates them; without it,
the process's own registry is served (:func:`apps.site.monitoring.metrics_exposition`).
Labels are bounded: model aliases and kinds, never teams, users or message ids.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

TTFT = Histogram(
    "ragtier_ttft_seconds",
    "Time from the answer's start to its first token.",
    ["model"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64),
)
OUTPUT_TOKENS_PER_SECOND = Histogram(
    "ragtier_output_tokens_per_second",
    "Decode rate of each answer after its first token.",
    ["model"],
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
)
INTER_TOKEN = Histogram(
    "ragtier_inter_token_seconds",
    "Gap between consecutive streamed chunks.",
    ["model"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
RETRIEVAL = Histogram(
    "ragtier_retrieval_seconds",
    "Embed, search, assemble and count, before generation.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
TOKENS = Counter(
    "ragtier_tokens",
    "Tokens charged, by kind, model and direction (input/output).",
    ["kind", "model", "direction"],
)
CONTEXT_LENGTH_EXCEEDED = Counter(
    "ragtier_context_length_exceeded", "Requests refused before calling the model."
)
UPSTREAM_ERRORS = Counter("ragtier_upstream_errors", "Inference tier failures.", ["code"])
RATE_LIMITED = Counter(
    "ragtier_rate_limited", "Requests refused with 429, by limit code.", ["code"]
)
BUDGET_OVERRUN = Counter(
    "ragtier_budget_overrun_nanodollars",
    "What answers cost past the worst case their reservation held (not charged to budgets).",
)
ADMISSION_UNAVAILABLE = Counter(
    "ragtier_admission_unavailable", "Requests refused with 503: the limiter was unreachable."
)
RESERVATIONS = Counter("ragtier_reservations", "Token reservations made, by kind.", ["kind"])
SETTLEMENTS = Counter("ragtier_settlements", "Token reservations settled, by kind.", ["kind"])
CONTEXT_FILL = Histogram(
    "ragtier_context_fill",
    "Prompt tokens over the served model's context window, per answer, by model.",
    ["model"],
    buckets=(0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0),
)
DETACHED = Gauge(
    "ragtier_answers_detached",
    "Answers generating with nobody reading them, within their grace period.",
    multiprocess_mode="livesum",
)
DETACHED_UNREAD_TOKENS = Counter(
    "ragtier_detached_unread_tokens",
    "Completion tokens made while the client was gone and never read, by model.",
    ["model"],
)
IN_FLIGHT = Gauge(
    "ragtier_generations_in_flight",
    "Answers being generated now.",
    multiprocess_mode="livesum",
)

QUEUE_DEPTH = Gauge(
    "ragtier_queue_depth",
    "Requests waiting for a slot at the inference tier.",
    multiprocess_mode="livesum",
)
SLOTS_IN_USE = Gauge(
    "ragtier_queue_slots_in_use",
    "Slots at the inference tier held by this service's requests.",
    multiprocess_mode="livesum",
)
QUEUE_WAIT = Histogram(
    "ragtier_queue_wait_seconds",
    "Time a request waited for a slot at the inference tier (granted or not).",
    buckets=(0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
QUEUE_FULL = Counter(
    "ragtier_queue_full", "Requests refused with 503 queue_full: no slot within the wait limit."
)
RESPONSE_CACHE = Counter(
    "ragtier_response_cache", "Response cache lookups, by result (hit, miss).", ["result"]
)
