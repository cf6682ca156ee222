"""The verdict rule: a dtype is judged against the error it has on a trusted device.

A fixed threshold (msprobe's "cosine > 0.99 and max abs error < 0.001") marks a bf16 run
wrong only for being bf16. The rule here is torch's own accuracy checker's and msprobe's
API pre-check's idea, per entry: measure the *noise floor* (the same model, the same inputs,
in the target's dtype on the reference device, against the reference), and pass the target
when its error is within ``k`` times that floor:

    allowed = max(k x floor, MIN_ALLOWED[dtype])       (a floor was measured)
    allowed = DEFAULT_ALLOWED[dtype]                   (no floor: the dtype's default)
    pass  <=>  error <= allowed, and no non-finite value on one side only

``error`` is the relative L2 error (tensor dumps) or the relative difference of the norms
(statistics dumps). ``k`` = 2 by default (torch's ``same()`` uses 2; msprobe's pre-check
ratios are 2 / 1.5 / 1.2 by watch level). ``MIN_ALLOWED`` keeps a floor of exactly zero (a
deterministic device compared with itself) from failing one rounding; ``DEFAULT_ALLOWED``
is a few units of the dtype's rounding, for compares made without a floor (then a
low-precision dtype's accumulated error can fail honestly: measure the floor).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["DEFAULT_ALLOWED", "DEFAULT_K", "MIN_ALLOWED", "Rule", "Verdict"]

DEFAULT_K = 2.0
#: Least error allowed with a measured floor, by target dtype.
MIN_ALLOWED = {"float64": 1e-12, "float32": 1e-6, "float16": 1e-4, "bfloat16": 1e-3}
#: Error allowed when no floor was measured, by target dtype.
DEFAULT_ALLOWED = {"float64": 1e-10, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
_UNKNOWN_DTYPE = 1e-5


@dataclass(frozen=True)
class Verdict:
    """Pass or fail, the metric that decided it, its value and what it was judged against."""

    ok: bool
    metric: str
    value: float | None
    allowed: float | None
    floor: float | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Rule:
    """``k`` x the floor, with the per-dtype constants above (overridable for a study)."""

    k: float = DEFAULT_K
    min_allowed: dict[str, float] = field(default_factory=lambda: dict(MIN_ALLOWED))
    default_allowed: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_ALLOWED))

    def __post_init__(self) -> None:
        if not (self.k > 0 and self.k < float("inf")):
            raise ValueError(f"k must be a positive finite number, not {self.k}")

    def allowed(self, dtype: str, floor: float | None) -> float:
        if floor is None:
            return self.default_allowed.get(dtype, _UNKNOWN_DTYPE)
        return max(self.k * floor, self.min_allowed.get(dtype, _UNKNOWN_DTYPE / 10))

    def judge(
        self, metric: str, value: float | None, dtype: str, floor: float | None,
        nonfinite_mismatch: int,
    ) -> Verdict:  # fmt: skip
        """The verdict of one entry's ``metric`` ``value`` in target ``dtype``."""
        allowed = self.allowed(dtype, floor)
        if nonfinite_mismatch:
            return Verdict(False, "nonfinite_mismatch", float(nonfinite_mismatch), 0.0, floor,
                           f"{nonfinite_mismatch} non-finite value(s) on one side only")  # fmt: skip
        if value is None:
            return Verdict(False, metric, None, allowed, floor,
                           f"{metric} cannot be computed (a zero or non-finite reference)")  # fmt: skip
        basis = f"{self.k:g} x floor {floor:.3g}" if floor is not None else f"{dtype} default"
        ok = value <= allowed
        why = f"{metric} {value:.3g} {'<=' if ok else '>'} {allowed:.3g} ({basis})"
        return Verdict(ok, metric, value, allowed, floor, why)

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "min_allowed": dict(self.min_allowed),
                "default_allowed": dict(self.default_allowed)}  # fmt: skip
