"""Index files written so that a crash leaves the old version or the new one, never half."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def folder_write(path: Path, fill: Callable[[Path], None]) -> None:
    """A folder at ``path``, filled by ``fill`` under a temporary name beside it (which must
    fsync what it writes), then renamed into place. A folder already at ``path`` is a
    version a rolled-back write left: versions only move forward, so it is replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        fill(tmp)
        if path.exists():
            shutil.rmtree(path)
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_directory(path.parent)


def fsync_directory(path: Path) -> None:
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
