"""The three on/off switches, their context manager and their environment variable.

The switch values live here; ``pypto_kernels_gutenocr.USE_PTO_*`` are properties
that read and write them, so the seed's ``module.USE_PTO_RMS_NORM = True`` keeps
working while the model hooks read one source of truth.

Environment: ``PYPTO_GUTENOCR_SWITCHES`` is a comma list of op names
(``rms_norm``, ``mrope``, ``swiglu_mlp``), or ``all`` / ``none``; read at import
and by :func:`load_from_env`. One variable (not three) so a bench arm can be
described by a single string.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping

OPS = ("rms_norm", "mrope", "swiglu_mlp")
FLAG_NAMES = {
    "rms_norm": "USE_PTO_RMS_NORM",
    "mrope": "USE_PTO_MROPE",
    "swiglu_mlp": "USE_PTO_SWIGLU_MLP",
}
ENV_VAR = "PYPTO_GUTENOCR_SWITCHES"

_lock = threading.Lock()
_state: dict[str, bool] = dict.fromkeys(OPS, False)


class SwitchError(ValueError):
    """An unknown op name in a switch setting."""


def _check(op: str) -> str:
    if op in FLAG_NAMES.values():
        op = next(k for k, v in FLAG_NAMES.items() if v == op)
    if op not in OPS:
        raise SwitchError(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    return op


def is_on(op: str) -> bool:
    return _state[_check(op)]


def set_switch(op: str, value: bool) -> None:
    with _lock:
        _state[_check(op)] = bool(value)


def snapshot() -> dict[str, bool]:
    """Current values keyed by flag name (USE_PTO_*), as reports show them."""
    return {FLAG_NAMES[op]: _state[op] for op in OPS}


def parse(spec: str) -> dict[str, bool]:
    """``"rms_norm,mrope"`` / ``"all"`` / ``"none"`` / ``""`` -> {op: bool} for all ops."""
    spec = spec.strip().lower()
    if spec in ("", "none", "off", "0"):
        return dict.fromkeys(OPS, False)
    if spec in ("all", "on", "1"):
        return dict.fromkeys(OPS, True)
    wanted = {_check(part.strip()) for part in spec.split(",") if part.strip()}
    return {op: op in wanted for op in OPS}


def load_from_env() -> dict[str, bool]:
    """Apply ``$PYPTO_GUTENOCR_SWITCHES`` if set; returns the resulting state."""
    spec = os.environ.get(ENV_VAR)
    if spec is not None:
        for op, value in parse(spec).items():
            set_switch(op, value)
    return dict(_state)


@contextlib.contextmanager
def pto_switches(values: Mapping[str, bool] | None = None, **ops: bool | None) -> Iterator[None]:
    """Set switches inside the block, restoring the previous values on exit.

    ``pto_switches(rms_norm=True)`` or ``pto_switches({"USE_PTO_MROPE": True})``;
    a value of None leaves that switch as it is.
    """
    wanted: dict[str, bool] = {}
    for key, value in {**(values or {}), **ops}.items():
        if value is not None:
            wanted[_check(key)] = bool(value)
    before = dict(_state)
    try:
        for op, value in wanted.items():
            set_switch(op, value)
        yield
    finally:
        with _lock:
            _state.update(before)


load_from_env()
