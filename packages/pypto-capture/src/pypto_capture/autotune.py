"""What inductor's autotuning chose while a step compiled, for the report.

``max-autotune`` modes time each candidate kernel of a GEMM (on CPU: the C++ GEMM
template's micro-kernels against MKL's packed linear) *while compiling*, on the machine as
it is at that moment, and keep the fastest. On a shared machine that choice is made under
the same noise as the measurement it feeds: two runs of one model can compile different
kernels, and their ratio then differs for a reason no interval shows. So the choices are
recorded (per autotuned op: its inputs' shapes, the chosen kernel, every candidate's
time) through inductor's own feedback hook (``select_algorithm.add_feedback_saver``), and
a compile whose choices came from inductor's caches (nothing was timed) says so.

Reproducible: inductor keeps each choice in its local autotune cache and the compiled
graph in its FX graph cache, so a later compile of the same step on the same machine (and
torch) reuses it. ``compile_mode="default"`` does not autotune at all.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["MAX_OPS", "AutotuneLog", "autotune_log", "kernel_kind"]

log = logging.getLogger(__name__)

#: Autotuned ops kept per compile, candidates per op (a report stays small).
MAX_OPS = 64
_MAX_CANDIDATES = 8


def _shape(node: Any) -> list[int] | None:
    try:
        return [int(s) for s in node.get_size()]
    except Exception:  # symbolic or unknown sizes: not recorded
        return None


def _name(choice: Any) -> str:
    return str(getattr(choice, "name", None) or type(choice).__name__)[:120]


def kernel_kind(name: str) -> str:
    """A chosen kernel's kind, without the per-compile index inductor numbers generated
    kernels with (``cpp_CppMicroGemmFP32Vec_3`` -> ``cpp_CppMicroGemmFP32Vec``): what two
    compiles are compared on."""
    return re.sub(r"_\d+$", "", name)


class AutotuneLog:
    """The autotuned ops of one compile (see the module); ``summary()`` for a report."""

    def __init__(self, hooked: bool, why: str | None = None) -> None:
        self.hooked = hooked
        self.why = why
        self.ops: list[dict[str, Any]] = []
        self.dropped = 0

    def saver(self, *args: Any) -> None:
        """inductor's feedback function: (timings, name, input nodes, choices, ...)."""
        try:
            timings, name, inputs = args[0], str(args[1]), args[2]
            if len(self.ops) >= MAX_OPS:
                self.dropped += 1
                return
            times = {_name(c): float(t) for c, t in timings.items()}
            ranked = sorted(times.items(), key=lambda kv: kv[1])
            self.ops.append(
                {
                    "op": name[:80],
                    "shapes": [_shape(n) for n in inputs][:4],
                    "chosen": ranked[0][0] if ranked else None,
                    "kind": kernel_kind(ranked[0][0]) if ranked else None,
                    "times_ms": dict(ranked[:_MAX_CANDIDATES]),
                }
            )
        except Exception as err:  # a hook must never break the compile
            log.debug("autotune feedback not recorded: %s", err)

    def summary(self) -> dict[str, Any]:
        """What the report keeps: the choices, or why there are none."""
        if not self.hooked:
            return {"recorded": False, "why": self.why}
        if not self.ops:
            return {
                "recorded": True,
                "ops": [],
                "why": "nothing was timed: no op had more than one candidate, or the choices "
                "came from inductor's autotune / FX graph caches (an earlier compile of this "
                "step on this machine)",
            }
        return {"recorded": True, "ops": self.ops, "dropped": self.dropped}


@contextlib.contextmanager
def autotune_log() -> Iterator[AutotuneLog]:
    """Record inductor's autotune choices made inside the block (its feedback hook,
    removed again on exit: only this block's compile is seen)."""
    try:
        from torch._inductor import select_algorithm as sa

        cache = sa.get_algorithm_selector_cache()
        savers = cache.feedback_saver_fns
        add = cache.add_feedback_saver
    except (ImportError, AttributeError) as err:
        yield AutotuneLog(False, f"this torch has no autotune feedback hook ({err})")
        return
    got = AutotuneLog(True)
    add(got.saver)
    try:
        yield got
    finally:
        with contextlib.suppress(ValueError):
            savers.remove(got.saver)
