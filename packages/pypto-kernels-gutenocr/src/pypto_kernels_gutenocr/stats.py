"""Which backend actually ran: per-op call counts and fallback reasons.

A fallback is never silent: the first time an op falls back for a given reason it
is logged at WARNING, and every call is counted, so a report can say "rms_norm:
pypto 0, reference 73 (hidden 1280 outside envelope)".
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .switches import OPS

log = logging.getLogger("pypto_kernels_gutenocr")

_lock = threading.Lock()
_calls: dict[str, dict[str, int]] = {op: {"pypto": 0, "reference": 0} for op in OPS}
_reasons: dict[str, str] = {}
_logged: set[tuple[str, str]] = set()


def record_pypto(op: str) -> None:
    with _lock:
        _calls[op]["pypto"] += 1


def record_fallback(op: str, reason: str) -> None:
    with _lock:
        _calls[op]["reference"] += 1
        _reasons[op] = reason
        first = (op, reason) not in _logged
        _logged.add((op, reason))
    if first:
        log.warning("%s: falling back to the torch reference: %s", op, reason)


def calls() -> dict[str, dict[str, int]]:
    with _lock:
        return {op: dict(c) for op, c in _calls.items()}


def fallback_reasons() -> dict[str, str]:
    with _lock:
        return dict(_reasons)


def reset() -> None:
    """Zero the counters (a bench phase starts from a clean count)."""
    with _lock:
        for c in _calls.values():
            c["pypto"] = c["reference"] = 0
        _reasons.clear()
        _logged.clear()


def report() -> dict[str, Any]:
    from .switches import snapshot

    return {"switches": snapshot(), "calls": calls(), "fallback_reasons": fallback_reasons()}
