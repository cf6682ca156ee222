"""Per-package switch and call-count registries.

Switches: each op of a package is on or off; one environment variable (a comma list of
op names, or ``all`` / ``none``) sets them at registration, so a bench arm is described
by one string. The flag names (``USE_PTO_*``) are how reports and module attributes
spell them.

Stats: which backend actually ran. A fallback is never silent: the first time an op
falls back for a given reason it is logged at WARNING on the package's logger, and every
call is counted, so a report can say "rms_norm: pypto 0, reference 73 (hidden 1280
outside envelope)".
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = ["StatsRegistry", "SwitchError", "SwitchRegistry"]


class SwitchError(ValueError):
    """An unknown op name in a switch setting."""


class SwitchRegistry:
    """The on/off switches of one package's ops (all off until set)."""

    def __init__(
        self,
        ops: Sequence[str],
        env_var: str,
        flag_names: Mapping[str, str] | None = None,
        *,
        load_env: bool = True,
    ) -> None:
        if not ops:
            raise ValueError("a switch registry needs at least one op")
        self.ops = tuple(ops)
        self.env_var = env_var
        self.flag_names = dict(flag_names or {op: f"USE_PTO_{op.upper()}" for op in self.ops})
        if set(self.flag_names) != set(self.ops):
            raise ValueError(f"flag_names must name exactly the ops {list(self.ops)}")
        self._lock = threading.Lock()
        self._state: dict[str, bool] = dict.fromkeys(self.ops, False)
        if load_env:
            self.load_from_env()

    def check(self, op: str) -> str:
        """The op name for an op or flag name; SwitchError for anything else."""
        if op in self.flag_names.values():
            op = next(k for k, v in self.flag_names.items() if v == op)
        if op not in self.ops:
            raise SwitchError(f"unknown op {op!r}; choose from {', '.join(self.ops)}")
        return op

    def is_on(self, op: str) -> bool:
        return self._state[self.check(op)]

    def set_switch(self, op: str, value: bool) -> None:
        with self._lock:
            self._state[self.check(op)] = bool(value)

    def snapshot(self) -> dict[str, bool]:
        """Current values keyed by flag name (USE_PTO_*), as reports show them."""
        return {self.flag_names[op]: self._state[op] for op in self.ops}

    def parse(self, spec: str) -> dict[str, bool]:
        """``"a,b"`` / ``"all"`` / ``"none"`` / ``""`` -> {op: bool} for all ops."""
        spec = spec.strip().lower()
        if spec in ("", "none", "off", "0"):
            return dict.fromkeys(self.ops, False)
        if spec in ("all", "on", "1"):
            return dict.fromkeys(self.ops, True)
        wanted = {self.check(part.strip()) for part in spec.split(",") if part.strip()}
        return {op: op in wanted for op in self.ops}

    def load_from_env(self) -> dict[str, bool]:
        """Apply the environment variable if set; returns the resulting state."""
        spec = os.environ.get(self.env_var)
        if spec is not None:
            for op, value in self.parse(spec).items():
                self.set_switch(op, value)
        return dict(self._state)

    @contextlib.contextmanager
    def pto_switches(
        self, values: Mapping[str, bool] | None = None, **ops: bool | None
    ) -> Iterator[None]:
        """Set switches inside the block, restoring the previous values on exit.

        ``pto_switches(rms_norm=True)`` or ``pto_switches({"USE_PTO_MROPE": True})``;
        a value of None leaves that switch as it is. Names are checked before any
        switch changes, so a typo changes nothing.
        """
        wanted: dict[str, bool] = {}
        for key, value in {**(values or {}), **ops}.items():
            if value is not None:
                wanted[self.check(key)] = bool(value)
        before = dict(self._state)
        try:
            for op, value in wanted.items():
                self.set_switch(op, value)
            yield
        finally:
            with self._lock:
                self._state.update(before)


class StatsRegistry:
    """Per-op call counts by backend (``pypto`` / ``reference``) and the last fallback reason."""

    def __init__(self, ops: Sequence[str], logger: logging.Logger | str) -> None:
        self.ops = tuple(ops)
        self.log = logging.getLogger(logger) if isinstance(logger, str) else logger
        self._lock = threading.Lock()
        self._calls: dict[str, dict[str, int]] = {op: {"pypto": 0, "reference": 0} for op in ops}
        self._reasons: dict[str, str] = {}
        self._logged: set[tuple[str, str]] = set()

    def record_pypto(self, op: str) -> None:
        with self._lock:
            self._calls[op]["pypto"] += 1

    def record_fallback(self, op: str, reason: str) -> None:
        with self._lock:
            self._calls[op]["reference"] += 1
            self._reasons[op] = reason
            first = (op, reason) not in self._logged
            self._logged.add((op, reason))
        if first:
            self.log.warning("%s: falling back to the torch reference: %s", op, reason)

    def calls(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {op: dict(c) for op, c in self._calls.items()}

    def fallback_reasons(self) -> dict[str, str]:
        with self._lock:
            return dict(self._reasons)

    def reset(self) -> None:
        """Zero the counters (a bench phase starts from a clean count)."""
        with self._lock:
            for c in self._calls.values():
                c["pypto"] = c["reference"] = 0
            self._reasons.clear()
            self._logged.clear()

    def report(self, switches: SwitchRegistry | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if switches is not None:
            out["switches"] = switches.snapshot()
        out["calls"] = self.calls()
        out["fallback_reasons"] = self.fallback_reasons()
        return out
