"""Typed errors raised deep and turned into one-line messages at the CLI edge.

Each carries the exit code the CLI returns for it, so a library caller (pypto-bench's gate)
and the command agree on what a failure means.
"""

from __future__ import annotations

from .codes import EXIT

__all__ = ["BadDumpError", "DumpTooLargeError", "NotComparableError", "PrecisionError"]


class PrecisionError(Exception):
    """Base of this package's errors; ``str()`` is one line naming the problem and the fix."""

    exit_code: int = EXIT.FAILED


class BadDumpError(PrecisionError):
    """A dump folder that cannot be read safely (untrusted input refused)."""

    exit_code = EXIT.BAD_DUMP


class NotComparableError(PrecisionError):
    """Two dumps that cannot be compared (no shared entry, different inputs)."""

    exit_code = EXIT.NOT_COMPARABLE


class DumpTooLargeError(PrecisionError):
    """A tensor-mode dump that would pass its byte bound."""

    exit_code = EXIT.TOO_LARGE
