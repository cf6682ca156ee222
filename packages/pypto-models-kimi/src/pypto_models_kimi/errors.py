"""Typed errors; ``str()`` of each is one line naming the problem and the fix.

Standard library only (pypto-patch imports the package to list presets). They subclass
``ValueError`` (config) and ``RuntimeError`` (weights) so transformers' and pypto-bench's
callers, which catch those around ``from_pretrained``, see them as load failures, and so
pypto-patch's pre-write check (which catches ``ValueError``) reports a config refusal.
"""

from __future__ import annotations

__all__ = ["KimiConfigError", "KimiError", "KimiWeightsError"]


class KimiError(Exception):
    """Base of this package's errors."""


class KimiConfigError(KimiError, ValueError):
    """config.json is not the checkpoint the pinned preset expects, or its ``auto_map``
    would run code other than the preset's."""


class KimiWeightsError(KimiError, RuntimeError):
    """The folder's weights do not match its config.json (missing, duplicated, extra,
    wrongly shaped, non-finite) or cannot be read."""
