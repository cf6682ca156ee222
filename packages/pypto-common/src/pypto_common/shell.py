"""Lines a shell evaluates: ``eval "$(tool ...)"`` must never run a path as code."""

from __future__ import annotations

import re
import shlex

__all__ = ["export_line"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def export_line(name: str, value: object) -> str:
    """``export NAME=<value quoted for POSIX sh>``; spaces, ``$(...)`` and quotes stay literal."""
    if not _NAME.match(name):
        raise ValueError(f"{name!r} is not a shell variable name")
    text = str(value)
    if "\n" in text or "\x00" in text:
        raise ValueError(f"{name} value contains a newline or NUL; refusing to emit it")
    return f"export {name}={shlex.quote(text)}"
