"""Files in and out, the one way every tool does it.

Out: every output is written to a temp file beside its path, fsynced, then renamed over
the path (:func:`atomic_write`). A crash or a full disk leaves the old file or none,
never a truncated one, and a symlink planted at the output's name is replaced, never
followed: the file it points to stays untouched.

In: untrusted files (profiles, manifests, reports) are read by :func:`read_regular_file`
(regular files only, opened without blocking so a FIFO cannot hang the reader, bounded
by the bytes actually read, not by a size the file claims) and parsed by
:func:`loads_bounded` (nesting depth and integer length checked before and while
parsing, so a hostile document is a :class:`UntrustedFileError` rather than a
RecursionError or a ValueError from deep inside ``json``).
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

__all__ = [
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "UntrustedFileError",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "json_depth",
    "loads_bounded",
    "read_regular_file",
]

#: Deepest nesting :func:`loads_bounded` accepts by default (the project's documents
#: nest a handful of levels; the limit keeps every recursive walk far from Python's).
MAX_JSON_DEPTH = 64
#: Longest integer literal :func:`loads_bounded` accepts by default (an int64 has 19
#: digits; Python refuses to convert more than 4300 with a ValueError).
MAX_INT_DIGITS = 40

_umask_lock = threading.Lock()


def _default_mode() -> int:
    """What ``open(path, "w")`` would give a new file: 0o666 less the umask."""
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: str | os.PathLike[str], writer: Callable[[BinaryIO], object]) -> Path:
    """Call ``writer(fh)`` on a temp file beside ``path``, fsync it, rename it over ``path``.

    Why: a crash or a full disk mid-write must leave the old file (or none), never a
    truncated one that a later run reads as valid; and the rename replaces a symlink
    planted at ``path`` instead of writing through it. The new file gets the mode a
    plain ``open(path, "w")`` would. ``OSError`` (and whatever ``writer`` raises)
    propagates unchanged, the temp file removed, so the caller can name the path and
    choose a fallback.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            writer(fh)
            fh.flush()
            os.fchmod(fh.fileno(), _default_mode())
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """:func:`atomic_write` of ``data``."""
    return atomic_write(path, lambda fh: fh.write(data))


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> Path:
    """:func:`atomic_write` of ``text`` encoded with ``encoding``."""
    return atomic_write_bytes(path, text.encode(encoding))


class UntrustedFileError(ValueError):
    """An untrusted file that cannot be read safely; ``str()`` is one line naming why.

    Callers turn it into their own typed error (adding the fix their users need).
    """


def read_regular_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of regular file ``path``, refusing anything else and anything over ``limit``.

    The file is opened non-blocking (a FIFO cannot hang the open) and checked with
    ``fstat`` on the open descriptor (no window between check and read); the size is
    bounded by reading at most ``limit + 1`` bytes, not by what ``stat`` claims
    (``/dev/zero`` and ``/proc`` files report 0). Raises :class:`UntrustedFileError`
    for a non-regular or oversize file and ``OSError`` (FileNotFoundError included)
    when it cannot be opened.
    """
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise UntrustedFileError(f"is {kind}")
    if st.st_size > limit:
        os.close(fd)
        raise UntrustedFileError(f"is {st.st_size} bytes, over the {limit}-byte limit")
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UntrustedFileError(f"holds more than the {limit}-byte limit")
    return data


# A JSON string (escapes included): removed before counting brackets.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[^\[\]{}]+")


def json_depth(text: str) -> int:
    """Deepest bracket nesting of JSON ``text`` (strings skipped), without parsing it."""
    depth = deepest = 0
    for ch in _BRACKETS.sub("", _JSON_STRING.sub("", text)):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads_bounded(
    text: str | bytes,
    *,
    max_depth: int = MAX_JSON_DEPTH,
    max_int_digits: int = MAX_INT_DIGITS,
    nonfinite_as_null: bool = False,
) -> Any:
    """``json.loads`` for untrusted documents: :class:`UntrustedFileError` for anything
    nesting deeper than ``max_depth``, an integer longer than ``max_int_digits``, a
    non-finite number (``NaN``, ``Infinity``, ``1e999``), undecodable bytes or invalid
    JSON, each in one line.

    ``nonfinite_as_null``: read a non-finite number as ``None`` instead (a format that
    writes ``NaN`` for a statistic of a tensor that holds one, e.g. msprobe's dump.json:
    the value is missing, the document is not refused)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise UntrustedFileError(f"is not UTF-8 text (byte {exc.start})") from None
    depth = json_depth(text)
    if depth > max_depth:
        raise UntrustedFileError(f"nests {depth} levels deep, more than the {max_depth} allowed")

    def parse_int(s: str) -> int:
        if len(s.lstrip("-")) > max_int_digits:
            raise UntrustedFileError(
                f"holds a {len(s.lstrip('-'))}-digit integer, more than the {max_int_digits} allowed"
            )
        return int(s)

    def parse_float(s: str) -> float | None:
        value = float(s)
        if value in (float("inf"), float("-inf")):
            if nonfinite_as_null:
                return None
            raise UntrustedFileError(f"holds the number {s[:20]}, beyond a float's range")
        return value

    def parse_constant(s: str) -> float | None:
        if nonfinite_as_null:
            return None
        raise UntrustedFileError(f"holds {s}, not a number")

    try:
        return json.loads(
            text, parse_int=parse_int, parse_float=parse_float, parse_constant=parse_constant
        )
    except UntrustedFileError:
        raise
    except (ValueError, RecursionError) as exc:
        raise UntrustedFileError(
            f"is not valid JSON ({' '.join(str(exc).split())[:100]})"
        ) from None
