"""pypto_bench.intervals.unpaired_ratio: the ratio of two medians with an interval, for
samples taken apart (two processes, two profiles), where pairing by index is wrong."""

from __future__ import annotations

import random

from pypto_bench.intervals import UNPAIRED_METHOD, unpaired_ratio


def test_covers_a_known_ratio_of_noisy_samples():
    rng = random.Random(3)
    base = [10.0 * rng.uniform(0.9, 1.1) for _ in range(20)]
    opt = [25.0 * rng.uniform(0.9, 1.1) for _ in range(15)]
    got = unpaired_ratio(opt, base, seed=1)
    assert got is not None
    assert got.low <= 2.5 <= got.high
    assert got.high - got.low < 0.5
    assert got.rounds == 15
    assert got.method == UNPAIRED_METHOD


def test_does_not_pair_by_index():
    # Paired by index, every ratio would be exactly 2 (a zero-width interval); apart,
    # the spread of each side shows in the interval.
    base = [1.0, 2.0, 3.0, 4.0, 5.0]
    opt = [2.0, 4.0, 6.0, 8.0, 10.0]
    got = unpaired_ratio(opt, base)
    assert got is not None
    assert got.median == 2.0
    assert got.high - got.low > 0.5


def test_seeded_and_none_without_values():
    a, b = [1.0, 1.2, 0.9, 1.1], [2.0, 2.1, 1.9]
    assert unpaired_ratio(a, b, seed=7) == unpaired_ratio(a, b, seed=7)
    assert unpaired_ratio([], b) is None
    assert unpaired_ratio(a, [None, float("nan")]) is None
    assert unpaired_ratio(a, [0.0, 0.0]) is None
    one = unpaired_ratio([3.0], [1.5])
    assert one is not None
    assert (one.low, one.median, one.high) == (2.0, 2.0, 2.0)
