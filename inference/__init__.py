"""Framework-free inference: tokenizers matched to the served model, prompt assembly inside
a token budget, and an async client for OpenAI-compatible servers.

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
    TokenizerUnavailable,
    UpstreamProtocolError,
)
from inference.prompt import SYSTEM_PROMPT, Passage, Prompt, assemble_prompt, render_passages
from inference.reasoning import ThinkSplitter
from inference.tokenizers import (
    ChatMessage,
    FakeTokenizer,
    GGUFTokenizer,
    HFTokenizer,
    RemoteTokenizer,
    Tokenizer,
    load_tokenizer,
    smollm2_gguf_path,
)

__all__ = [
    "SYSTEM_PROMPT",
    "ChatMessage",
    "ChatRequest",
    "ContextLengthExceeded",
    "Event",
    "FakeTokenizer",
    "Finished",
    "GGUFTokenizer",
    "HFTokenizer",
    "InferenceError",
    "InferenceTimeout",
    "InferenceUnavailable",
    "OpenAIClient",
    "Passage",
    "Prompt",
    "ReasoningDelta",
    "RemoteTokenizer",
    "Retry",
    "TextDelta",
    "ThinkSplitter",
    "Timeouts",
    "Tokenizer",
    "TokenizerUnavailable",
    "UpstreamProtocolError",
    "UpstreamUsage",
    "assemble_prompt",
    "load_tokenizer",
    "render_passages",
    "smollm2_gguf_path",
]
