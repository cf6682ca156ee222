"""The precision suite: ``precision_cases.json`` run through the ops and their references.

Each case returns the step's output and the updated state (both are the op's results).
The runner clones the state before the call: the op updates it in place, and the golden
and the kernel run must each start from the case's state.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pypto_kernels_common import PrecisionSuite

from .ops import gated_delta_step, kda_step
from .package import PACKAGE
from .reference import gated_delta_step_reference, kda_step_reference

__all__ = ["SUITE", "golden", "load_cases", "load_document", "run_kernel"]


def _runner(
    op: str, fn: Callable[..., torch.Tensor], ref: Callable[..., torch.Tensor]
) -> Callable[[bool], Callable[..., dict[str, torch.Tensor]]]:
    def runner(kernel: bool) -> Callable[..., dict[str, torch.Tensor]]:
        def run(**inputs: torch.Tensor) -> dict[str, torch.Tensor]:
            state = inputs.pop("state").clone()
            if kernel:
                with PACKAGE.switches.pto_switches({op: True}):
                    y = fn(state=state, **inputs)
            else:
                y = ref(state=state, **inputs)
            return {"y": y, "state": state}

        return run

    return runner


SUITE = PrecisionSuite(
    __package__ or "pypto_kernels_linear_attention",
    {
        "gated_delta_step": _runner(
            "gated_delta_step", gated_delta_step, gated_delta_step_reference
        ),
        "kda_step": _runner("kda_step", kda_step, kda_step_reference),
    },
)
load_document = SUITE.load_document
load_cases = SUITE.load_cases
golden = SUITE.golden
run_kernel = SUITE.run_kernel
