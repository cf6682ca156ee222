"""Medians with confidence intervals over rounds: the estimator every ratio is read with.

Pure Python (no torch): a round is one timed iteration of every arm (see
:mod:`pypto_bench.rounds`); its paired ratio is one arm's tok/s over the baseline's in
the *same* round, so drift slower than a round cancels. The interval is a seeded
percentile bootstrap of the median over rounds (:data:`METHOD`): resample the rounds
with replacement, take each resample's median, and read the 2.5th and 97.5th
percentiles. Seeded, so the same samples always give the same interval.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "CI_LEVEL",
    "METHOD",
    "RESAMPLES",
    "UNPAIRED_METHOD",
    "Interval",
    "bootstrap_median",
    "interval",
    "paired_ratios",
    "relative_half_width",
    "unpaired_ratio",
]

#: The interval's coverage.
CI_LEVEL = 0.95
#: Bootstrap resamples per interval.
RESAMPLES = 2000
#: What the report's ``method`` field says.
METHOD = f"percentile bootstrap of the median over rounds ({RESAMPLES} resamples, seeded)"
#: ...and for :func:`unpaired_ratio` (two sample sets with no round to pair them by).
UNPAIRED_METHOD = (
    "unpaired percentile bootstrap of the ratio of medians "
    f"(each side resampled on its own, {RESAMPLES} resamples, seeded)"
)


@dataclass(frozen=True)
class Interval:
    """A median and its confidence interval over ``rounds`` values."""

    median: float
    low: float
    high: float
    rounds: int
    method: str = METHOD
    level: float = CI_LEVEL

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 1] of already sorted values."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac


def bootstrap_median(
    values: Sequence[float | None],
    *,
    seed: int = 0,
    resamples: int = RESAMPLES,
    level: float = CI_LEVEL,
) -> dict[str, Any] | None:
    """``{"median", "low", "high", "rounds", "method", "level"}`` of ``values`` (one per
    round); None without values. One value: a zero-width interval (nothing to resample)."""
    got = interval(values, seed=seed, resamples=resamples, level=level)
    return got.to_dict() if got is not None else None


def interval(
    values: Sequence[float | None],
    baseline: Sequence[float | None] | None = None,
    *,
    seed: int = 0,
    resamples: int = RESAMPLES,
    level: float = CI_LEVEL,
) -> Interval | None:
    """The median of ``values`` with its interval; with ``baseline``, of the paired
    ratios ``values[r] / baseline[r]`` (:func:`paired_ratios`). None without values."""
    if baseline is not None:
        values = paired_ratios(values, baseline)
    data = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not data:
        return None
    median = statistics.median(data)
    n = len(data)
    if n == 1:
        low = high = median
    else:
        rng = random.Random(seed)
        meds = sorted(statistics.median(rng.choices(data, k=n)) for _ in range(resamples))
        alpha = (1.0 - level) / 2
        low, high = _percentile(meds, alpha), _percentile(meds, 1.0 - alpha)
    method = METHOD if resamples == RESAMPLES else METHOD.replace(str(RESAMPLES), str(resamples))
    return Interval(median=median, low=low, high=high, rounds=n, method=method, level=level)


def paired_ratios(values: Sequence[float | None], baseline: Sequence[float | None]) -> list[float]:
    """Round-by-round ``values[r] / baseline[r]`` (rounds where either is missing or the
    baseline is not positive are skipped)."""
    out = []
    for v, b in zip(values, baseline, strict=False):
        if v is None or b is None or not b > 0:
            continue
        out.append(float(v) / float(b))
    return out


def relative_half_width(interval: dict[str, Any] | None) -> float | None:
    """(high - low) / 2 / median: how tight an interval is (None: no interval, or a
    median of zero)."""
    if not interval or not interval.get("median"):
        return None
    return (interval["high"] - interval["low"]) / 2 / abs(interval["median"])


def unpaired_ratio(
    values: Sequence[float | None],
    baseline: Sequence[float | None],
    *,
    seed: int = 0,
    resamples: int = RESAMPLES,
    level: float = CI_LEVEL,
) -> Interval | None:
    """median(values) / median(baseline) with a percentile-bootstrap interval, for
    samples taken apart (two processes, two profiles): each side is resampled on its
    own, since pairing them by index would invent rounds that never happened. ``rounds``
    is the smaller side's count. None when either side has no finite value or the
    baseline's median is not positive."""
    a = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    b = [float(v) for v in baseline if v is not None and math.isfinite(float(v))]
    if not a or not b or not statistics.median(b) > 0:
        return None
    median = statistics.median(a) / statistics.median(b)
    if len(a) == 1 and len(b) == 1:
        low = high = median
    else:
        rng = random.Random(seed)
        ratios = []
        for _ in range(resamples):
            mb = statistics.median(rng.choices(b, k=len(b)))
            if mb > 0:
                ratios.append(statistics.median(rng.choices(a, k=len(a))) / mb)
        ratios.sort()
        alpha = (1.0 - level) / 2
        low, high = (
            (_percentile(ratios, alpha), _percentile(ratios, 1.0 - alpha))
            if ratios
            else (median, median)
        )
    method = (
        UNPAIRED_METHOD
        if resamples == RESAMPLES
        else UNPAIRED_METHOD.replace(str(RESAMPLES), str(resamples))
    )
    return Interval(
        median=median, low=low, high=high, rounds=min(len(a), len(b)), method=method, level=level
    )
