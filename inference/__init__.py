"""Framework-free inference: the model registry, tokenizers matched to each served model,
prompt assembly inside a token budget, an async client for OpenAI-compatible servers, the
fair queue and the circuit breaker in front of each of them, and fallback between them.

Nothing here imports Django; the apps call this package, never the reverse.
"""

from inference.breaker import (
    BreakerPolicy,
    CircuitBreaker,
    CircuitState,
    LocalBreakerStore,
    RedisBreakerStore,
)
from inference.chat import (
    ChatRequest,
    Event,
    Finished,
    ReasoningDelta,
    Sampling,
    TextDelta,
    UpstreamUsage,
)
from inference.client import OpenAIClient, Retry, Timeouts
from inference.dialects import sampling_refused, sampling_wire
from inference.errors import (
    ContextLengthExceeded,
    InferenceError,
    InferenceTimeout,
    InferenceUnavailable,
    Interrupted,
    QueueFull,
    SchedulerUnavailable,
    TokenizerUnavailable,
    UpstreamProtocolError,
    UpstreamRateLimited,
    UpstreamRejected,
)
from inference.failover import AllUpstreamsDown, Failover, Target
from inference.prompt import (
    MAX_CHARS_PER_TOKEN,
    SYSTEM_PROMPT,
    Passage,
    Prompt,
    assemble_prompt,
    render_passages,
)
from inference.reasoning import ThinkSplitter
from inference.registry import (
    ModelEntry,
    Price,
    Registry,
    RegistryError,
    TokenizerSpec,
    registry_parse,
    rendezvous_order,
)
from inference.scheduling import FairQueue, Lease, LocalScheduler, RedisScheduler, Scheduler
from inference.stream import Interrupt
from inference.tokenizers import (
    ChatMessage,
    FakeTokenizer,
    GGUFTokenizer,
    HFTokenizer,
    RemoteTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    escape_control_tokens,
    load_tokenizer,
    smollm2_gguf_path,
)

__all__ = [
    "MAX_CHARS_PER_TOKEN",
    "SYSTEM_PROMPT",
    "AllUpstreamsDown",
    "BreakerPolicy",
    "ChatMessage",
    "ChatRequest",
    "CircuitBreaker",
    "CircuitState",
    "ContextLengthExceeded",
    "Event",
    "Failover",
    "FairQueue",
    "FakeTokenizer",
    "Finished",
    "GGUFTokenizer",
    "HFTokenizer",
    "InferenceError",
    "InferenceTimeout",
    "InferenceUnavailable",
    "Interrupt",
    "Interrupted",
    "Lease",
    "LocalBreakerStore",
    "LocalScheduler",
    "ModelEntry",
    "OpenAIClient",
    "Passage",
    "Price",
    "Prompt",
    "QueueFull",
    "ReasoningDelta",
    "RedisBreakerStore",
    "RedisScheduler",
    "Registry",
    "RegistryError",
    "RemoteTokenizer",
    "Retry",
    "Sampling",
    "Scheduler",
    "SchedulerUnavailable",
    "Target",
    "TextDelta",
    "ThinkSplitter",
    "TiktokenTokenizer",
    "Timeouts",
    "Tokenizer",
    "TokenizerSpec",
    "TokenizerUnavailable",
    "UpstreamProtocolError",
    "UpstreamRateLimited",
    "UpstreamRejected",
    "UpstreamUsage",
    "assemble_prompt",
    "escape_control_tokens",
    "load_tokenizer",
    "registry_parse",
    "render_passages",
    "rendezvous_order",
    "sampling_refused",
    "sampling_wire",
    "smollm2_gguf_path",
]
