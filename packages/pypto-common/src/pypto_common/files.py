"""Writes that never leave a half-written file behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to a temp file beside ``path``, fsync it, then rename over ``path``.

    Why: a crash or a full disk mid-write must leave the old file (or none), never a
    truncated one that a later run reads as valid. Raises ``OSError`` unchanged so the
    caller can choose a fallback location.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding) as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target
