"""Exceptions raised by the inference package. No ``httpx`` error ever leaves it."""

from __future__ import annotations


class InferenceError(Exception):
    """Root of every error this package raises; ``code`` is stable for API mapping."""

    code = "inference_error"
    status = 502

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retry_after: float | None = None,
        alias: str | None = None,
    ):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.retry_after = retry_after
        self.alias = alias
        """The model alias that failed (set by :class:`inference.Failover`): what a caller
        may be told, where the upstream's URL may not."""


class Interrupted(InferenceError):
    """The caller stopped the stream while it waited for the tier (:class:`Interrupt`): not
    the tier's fault, nothing to retry or fail over."""

    code = "cancelled"
    status = 499


class InferenceUnavailable(InferenceError):
    """The tier refused or could not be reached (connection error, 429/5xx): a bad
    gateway, 502, as the HTTP contract binds it (503 is for this service's own overload)."""

    code = "inference_unavailable"
    status = 502


class InferenceTimeout(InferenceError):
    """No first token, or no next token, within its timeout."""

    code = "inference_timeout"
    status = 504


class UpstreamProtocolError(InferenceError):
    """The tier answered something that is not the OpenAI streaming protocol."""

    code = "inference_protocol_error"
    status = 502


class ContextLengthExceeded(InferenceError):
    """The prompt (plus the output reservation) does not fit the model's context window."""

    code = "context_length_exceeded"
    status = 400


class UpstreamRejected(InferenceError):
    """The tier refused the request itself as invalid (400, TGI's 422): retrying would fail
    the same way, and the fault lies in what was asked, so 400."""

    code = "invalid_request"
    status = 400


class UpstreamRateLimited(InferenceError):
    """The tier said 429 and asked for longer than this service waits before answering:
    the caller gets the 429 with the tier's ``Retry-After``, in full."""

    code = "inference_rate_limited"
    status = 429


class TokenizerUnavailable(InferenceError):
    """A tokenizer cannot be loaded; the message says what to set or install."""

    code = "tokenizer_unavailable"
    status = 500


class QueueFull(InferenceError):
    """No slot to the tier came free within the caller's wait: this service's own overload,
    so 503, with ``retry_after`` estimated from the measured service rate."""

    code = "queue_full"
    status = 503


class SchedulerUnavailable(InferenceError):
    """The store that bounds concurrency (Redis) cannot be reached. The app fails closed:
    it sends nothing it cannot count, and answers 503. The code is shared with the other
    Redis-backed limits, which fail the same way for the same reason."""

    code = "rate_limiter_unavailable"
    status = 503
