"""Which backend actually ran: per-op call counts and fallback reasons.

The counters live in :data:`.package.PACKAGE` (a pypto-kernels-common
``StatsRegistry``): a fallback is counted on every call and logged once per reason on
the ``pypto_kernels_gutenocr`` logger.
"""

from __future__ import annotations

from typing import Any

from .package import PACKAGE

__all__ = [
    "REGISTRY",
    "calls",
    "fallback_reasons",
    "record_fallback",
    "record_pypto",
    "report",
    "reset",
]

REGISTRY = PACKAGE.stats

record_pypto = REGISTRY.record_pypto
record_fallback = REGISTRY.record_fallback
calls = REGISTRY.calls
fallback_reasons = REGISTRY.fallback_reasons
reset = REGISTRY.reset


def report() -> dict[str, Any]:
    """Switches, per-op call counts by backend, and the last fallback reason per op."""
    return PACKAGE.report()
