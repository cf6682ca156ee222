"""Typed errors; ``str()`` of each is one line naming the problem and the fix.

Standard library only (pypto-patch imports the package to list presets). They subclass
``ValueError`` (config) and ``RuntimeError`` (weights) so transformers' and pypto-bench's
callers, which catch those around ``from_pretrained``, see them as load failures.
"""

from __future__ import annotations

__all__ = ["MiniMaxConfigError", "MiniMaxError", "MiniMaxWeightsError"]


class MiniMaxError(Exception):
    """Base of this package's errors."""


class MiniMaxConfigError(MiniMaxError, ValueError):
    """config.json is not the checkpoint the pinned preset expects."""


class MiniMaxWeightsError(MiniMaxError, RuntimeError):
    """The folder's weights do not match its config.json (missing, extra, wrong shape,
    damaged FP8 scales) or cannot be read."""
