"""Internal to :mod:`pypto_bench.multi`: the small things several of its modules share.

Not an API: nothing outside ``pypto_bench.multi`` imports this module.
"""

from __future__ import annotations

import logging
import statistics
from typing import Any, Protocol

__all__ = ["Beat", "NoBeat", "spread"]

log = logging.getLogger("pypto_bench.multi")


class Beat(Protocol):
    """Where a long step reports progress: a rank's heartbeat file (read by the launcher's
    watchdog), or nothing outside a rank."""

    def advance(self, stage: str) -> None: ...


class NoBeat:
    """Progress outside a rank (the pipeline placement's one process): a debug line."""

    def advance(self, stage: str) -> None:
        log.debug("%s", stage)


def spread(values: list[float]) -> dict[str, Any]:
    """min / median / max of a list of seconds (all None when it is empty)."""
    if not values:
        return {"min": None, "median": None, "max": None}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}
