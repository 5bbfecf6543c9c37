"""Limits every endpoint enforces before expensive work (defaults: the README's limits table)."""

from config.env import env
from config.settings.inference import INFERENCE_MODELS, MODEL_ALIASES

MAX_JSON_BODY_BYTES = env.int("RAGTIER_MAX_JSON_BODY_BYTES", default=1024 * 1024)
MAX_UPLOAD_BYTES = env.int("RAGTIER_MAX_UPLOAD_BYTES", default=25 * 1024 * 1024)
MAX_PDF_PAGES = env.int("RAGTIER_MAX_PDF_PAGES", default=2000)
MAX_DOCUMENT_CHARS = env.int("RAGTIER_MAX_DOCUMENT_CHARS", default=5_000_000)
# Start tags in one HTML file, counted before its tree is built: the tree costs far more
# per element than the three bytes of a `<b>` (docs/abuse.md).
MAX_HTML_ELEMENTS = env.int("RAGTIER_MAX_HTML_ELEMENTS", default=200_000)
# The parse stage reads every file in a child process of its own, bounded in address space
# (MiB) and CPU seconds (0: no bound); past either the document fails, alone, with
# `parse_memory_limit_exceeded` or `parse_time_limit_exceeded`. The time bound stays well
# inside the stage's soft time limit, so the document fails with its own reason.
PARSE_MEMORY_LIMIT_MB = env.int("PARSE_MEMORY_LIMIT_MB", default=1024)
PARSE_TIME_LIMIT_SECONDS = env.int("PARSE_TIME_LIMIT_SECONDS", default=120)
MAX_CHUNKS_PER_DOCUMENT = env.int("RAGTIER_MAX_CHUNKS_PER_DOCUMENT", default=20_000)
MAX_COLLECTIONS_PER_TEAM = env.int("RAGTIER_MAX_COLLECTIONS_PER_TEAM", default=100)
MAX_QUERY_CHARS = env.int("RAGTIER_MAX_QUERY_CHARS", default=4000)
MAX_TOP_K = env.int("RAGTIER_MAX_TOP_K", default=50)
MAX_PAGE_SIZE = env.int("RAGTIER_MAX_PAGE_SIZE", default=100)

# The chat surfaces check these before anything is counted with the tokenizer.
# /v1/chat/completions: at most this many messages (400 too_many_messages).
MAX_CHAT_MESSAGES = env.int("RAGTIER_MAX_CHAT_MESSAGES", default=1000)
# A generous bound on the characters one token covers (English averages about four): a
# window of n tokens holds at most n times this many characters.
MAX_CHARS_PER_TOKEN = env.int("RAGTIER_MAX_CHARS_PER_TOKEN", default=16)
# One message longer than this fits no configured context window: 400
# context_length_exceeded. A window read from the tier is unknown here; then only the
# body limit bounds a message, and the model's own window is checked before counting.
_models = INFERENCE_MODELS or MODEL_ALIASES
_windows = [
    config.get("context_window") if isinstance(config, dict) else None
    for config in _models.values()
]
MAX_MESSAGE_CHARS = env.int(
    "RAGTIER_MAX_MESSAGE_CHARS",
    default=(
        MAX_CHARS_PER_TOKEN * max(int(str(w)) for w in _windows)
        if all(_windows)
        else MAX_JSON_BODY_BYTES
    ),
)

# POST /v1/embeddings: at most this many inputs (400 too_many_inputs), each at most this
# many characters (400 input_too_large, before it is tokenized: a bound on the tokenizer's
# work, far past what the model reads), and this many tokens in all (400 too_many_tokens,
# counted with the model's tokenizer before anything is reserved or embedded). One input
# longer than the model reads is 400 context_length_exceeded, as OpenAI answers.
EMBEDDINGS_MAX_INPUTS = env.int("RAGTIER_EMBEDDINGS_MAX_INPUTS", default=256)
EMBEDDINGS_MAX_INPUT_CHARS = env.int("RAGTIER_EMBEDDINGS_MAX_INPUT_CHARS", default=32_768)
EMBEDDINGS_MAX_TOKENS = env.int("RAGTIER_EMBEDDINGS_MAX_TOKENS", default=65_536)

# Django's own guards agree with ours, for the paths that bypass the ASGI limit (tests, WSGI).
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_JSON_BODY_BYTES
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
