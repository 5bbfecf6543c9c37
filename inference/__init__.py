"""Framework-free inference: tokenizers matched to the served model, prompt assembly inside
a token budget, an async client for OpenAI-compatible servers, and the fair queue in front
of each of them.

Nothing here imports Django; the apps call this package, never the reverse.
"""

from inference.client import (
    ChatRequest,
    Event,
    Finished,
    OpenAIClient,
    ReasoningDelta,
    Retry,
    TextDelta,
    Timeouts,
    UpstreamUsage,
)
from inference.errors import (
    ContextLengthExceeded,
    InferenceError,
    InferenceTimeout,
    InferenceUnavailable,
    QueueFull,
    SchedulerUnavailable,
    TokenizerUnavailable,
    UpstreamProtocolError,
    UpstreamRateLimited,
    UpstreamRejected,
)
from inference.prompt import (
    MAX_CHARS_PER_TOKEN,
    SYSTEM_PROMPT,
    Passage,
    Prompt,
    assemble_prompt,
    render_passages,
)
from inference.reasoning import ThinkSplitter
from inference.scheduler import FairQueue, Lease, LocalScheduler, RedisScheduler, Scheduler
from inference.tokenizers import (
    ChatMessage,
    FakeTokenizer,
    GGUFTokenizer,
    HFTokenizer,
    RemoteTokenizer,
    Tokenizer,
    escape_control_tokens,
    load_tokenizer,
    smollm2_gguf_path,
)

__all__ = [
    "MAX_CHARS_PER_TOKEN",
    "SYSTEM_PROMPT",
    "ChatMessage",
    "ChatRequest",
    "ContextLengthExceeded",
    "Event",
    "FairQueue",
    "FakeTokenizer",
    "Finished",
    "GGUFTokenizer",
    "HFTokenizer",
    "InferenceError",
    "InferenceTimeout",
    "InferenceUnavailable",
    "Lease",
    "LocalScheduler",
    "OpenAIClient",
    "Passage",
    "Prompt",
    "QueueFull",
    "ReasoningDelta",
    "RedisScheduler",
    "RemoteTokenizer",
    "Retry",
    "Scheduler",
    "SchedulerUnavailable",
    "TextDelta",
    "ThinkSplitter",
    "Timeouts",
    "Tokenizer",
    "TokenizerUnavailable",
    "UpstreamProtocolError",
    "UpstreamRateLimited",
    "UpstreamRejected",
    "UpstreamUsage",
    "assemble_prompt",
    "escape_control_tokens",
    "load_tokenizer",
    "render_passages",
    "smollm2_gguf_path",
]
