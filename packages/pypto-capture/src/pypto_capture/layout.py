"""How a model's layers are laid out, in words a report can print.

Hybrid decoders (Gemma 2/3/4, Mistral-style sliding windows) interleave layer types, and
what a capture-safe cache allocates depends on that interleaving: sliding layers hold
``window`` slots, full layers ``max_cache_len``. A report that names the pattern and the
per-layer sizes lets a reader check the memory figure instead of trusting it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["layer_pattern"]


def _runs(types_: Sequence[str]) -> list[tuple[str, int]]:
    runs: list[tuple[str, int]] = []
    for t in types_:
        if runs and runs[-1][0] == t:
            runs[-1] = (t, runs[-1][1] + 1)
        else:
            runs.append((t, 1))
    return runs


def _fmt(runs: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{n} {t}" for t, n in runs)


def layer_pattern(layer_types: Sequence[str]) -> str:
    """A compact description, e.g. ``"10 x (5 sliding_attention, 1 full_attention)"``.

    The shortest block of runs that repeats is written once with its count; a tail that
    does not complete the block follows after ``" + "``. No repetition: the runs in order.
    """
    runs = _runs(list(layer_types))
    if not runs:
        return "no layers"
    for size in range(1, len(runs) // 2 + 1):
        block = runs[:size]
        reps = 1
        while runs[reps * size : (reps + 1) * size] == block:
            reps += 1
        if reps < 2:
            continue
        tail = runs[reps * size :]
        # A tail that is a prefix of the block (e.g. the final full layer) reads naturally.
        text = f"{reps} x ({_fmt(block)})"
        return f"{text} + {_fmt(tail)}" if tail else text
    return _fmt(runs)
