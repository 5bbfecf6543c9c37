"""Data protection: encryption at rest, retention, the OpenAI surface's storage, and
idempotency keys.

``RAGTIER_ENCRYPTION_KEYS`` are Fernet keys (``Fernet.generate_key()``), comma-separated:
the first encrypts, every one decrypts. To rotate, put a new key first, run
``manage.py rotate_encryption_key``, then drop the old one. Left empty (the embedded
default only; production refuses to start), a key is made on first use and kept in
``ENCRYPTION_KEY_FILE`` (mode 0600): back that file up with the database.
"""

from pathlib import Path

from config.env import DATA_DIR, env

ENCRYPTION_KEYS = env.list("RAGTIER_ENCRYPTION_KEYS", default=[])
ENCRYPTION_KEY_FILE = Path(
    env.str("RAGTIER_ENCRYPTION_KEY_FILE", default="") or DATA_DIR / "encryption.key"
)
# Rows re-encrypted per transaction by rotate_encryption_key.
ENCRYPTION_ROTATE_BATCH = env.int("RAGTIER_ENCRYPTION_ROTATE_BATCH", default=500)

# /v1/chat/completions keeps no conversation unless the request says ``store: true`` or
# this is on (OpenAI's own default is not to store).
OPENAI_STORE_DEFAULT = env.bool("OPENAI_STORE_DEFAULT", default=False)

# How long an Idempotency-Key is remembered (per team), and after how long a first
# request still marked running is taken to have died with its process.
IDEMPOTENCY_KEY_TTL_SECONDS = env.int("IDEMPOTENCY_KEY_TTL_SECONDS", default=24 * 3600)
IDEMPOTENCY_STALE_SECONDS = env.int("IDEMPOTENCY_STALE_SECONDS", default=3600)
