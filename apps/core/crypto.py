"""Encryption at rest, in one place: Fernet (AES-128-CBC with HMAC-SHA256) through
MultiFernet, so that several keys decrypt and the first one encrypts.

What is encrypted: message content and reasoning, conversation titles (the page makes
them from the first question), stored answer events (database and Redis), uploaded
document files. What is not: document chunk text (the keyword and vector indexes search
it), document titles, usage and citations' ids and scores.

The keys come from ``settings.ENCRYPTION_KEYS``; when none are set (the embedded default
only: production refuses to start), a key is generated once into
``settings.ENCRYPTION_KEY_FILE`` with mode 0600.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

__all__ = [
    "InvalidToken",
    "decrypt_bytes",
    "decrypt_text",
    "encrypt_bytes",
    "encrypt_text",
    "encryption_keys",
    "fernet",
    "is_encrypted",
    "reencrypt",
]

logger = logging.getLogger(__name__)

# Every Fernet token starts with its version byte 0x80, which base64 writes "gAAAAA".
TOKEN_PREFIX = b"gAAAAA"


def encryption_keys() -> tuple[str, ...]:
    """The configured keys, or the embedded default's key file (made on first use)."""
    keys = tuple(key.strip() for key in settings.ENCRYPTION_KEYS if key.strip())
    if keys:
        return keys
    return (_key_file_read_or_create(Path(settings.ENCRYPTION_KEY_FILE)),)


def fernet() -> MultiFernet:
    return _fernet(encryption_keys())


@functools.cache
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    try:
        return MultiFernet([Fernet(key.encode("ascii")) for key in keys])
    except (ValueError, UnicodeEncodeError):
        raise ImproperlyConfigured(
            "RAGTIER_ENCRYPTION_KEYS must be comma-separated Fernet keys (32 url-safe base64 "
            "bytes each; make one with: python -c 'from cryptography.fernet import Fernet; "
            "print(Fernet.generate_key().decode())')."
        ) from None


@functools.cache  # read once per process, not once per encryption
def _key_file_read_or_create(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written whole under another name, then linked into place: a process racing this one
    # either wins the link or reads the winner's complete file.
    descriptor, draft = tempfile.mkstemp(dir=path.parent, prefix=".encryption-key-")
    try:
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(Fernet.generate_key().decode("ascii") + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        else:
            logger.warning(
                "created the encryption key file %s (mode 0600): stored prompts, answers and "
                "uploads are encrypted with it; back it up with the database, or set "
                "RAGTIER_ENCRYPTION_KEYS",
                path,
            )
    finally:
        Path(draft).unlink(missing_ok=True)
    return path.read_text(encoding="ascii").strip()


def encrypt_bytes(data: bytes) -> bytes:
    return fernet().encrypt(data)


def decrypt_bytes(token: bytes) -> bytes:
    """Raises ``InvalidToken`` when no configured key decrypts ``token``."""
    return fernet().decrypt(token)


def encrypt_text(text: str) -> str:
    """A token for ``text``; the empty string stays empty (so that "no content" can still be
    filtered on, and costs no bytes)."""
    return fernet().encrypt(text.encode("utf-8")).decode("ascii") if text else ""


def decrypt_text(token: str) -> str:
    return fernet().decrypt(token.encode("ascii")).decode("utf-8") if token else ""


def is_encrypted(value: bytes | str) -> bool:
    """Whether ``value`` is a token one of the keys decrypts (not merely looks like one)."""
    raw = value.encode("ascii", "replace") if isinstance(value, str) else value
    if not raw.startswith(TOKEN_PREFIX):
        return False
    try:
        fernet().decrypt(raw)
    except InvalidToken:
        return False
    return True


def reencrypt(token: bytes) -> bytes:
    """``token`` under the first key (whichever key wrote it); for key rotation."""
    return fernet().rotate(token)
