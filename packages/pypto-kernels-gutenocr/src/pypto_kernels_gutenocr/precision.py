"""Precision cases: this package's cases in pypto-kernels-common's one JSON schema.

A case names its op, a seed, its inputs (shape + dtype + how to fill, or a
plain value), its outputs and tolerances. ``cpu_path`` says whether the PyPTO
CPU (SIM + verify) run uses the full model shapes or reduced ones, and why, so
the test report states which was exercised. Loading, inputs, goldens and the
comparison are pypto-kernels-common's; this module says how to run each op.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pypto_kernels_common.precision import (
    CASES_RESOURCE,
    SCHEMA_RESOURCE,
    Case,
    PrecisionSuite,
    compare,
    load_schema,
    make_inputs,
)

from . import reference
from .ops import PACKED

__all__ = [
    "CASES_RESOURCE",
    "SCHEMA_RESOURCE",
    "SUITE",
    "Case",
    "compare",
    "golden",
    "load_cases",
    "load_document",
    "load_schema",
    "make_inputs",
    "run_kernel",
]


def _rms(kernel: bool) -> Callable[..., dict[str, torch.Tensor]]:
    from .ops import rms_norm_wrapper

    def run(hidden_states, weight, eps):
        if kernel:
            return {"y": rms_norm_wrapper(hidden_states, weight, eps)}
        return {"y": reference.rms_norm_reference(hidden_states, weight, eps)}

    return run


def _mrope(kernel: bool) -> Callable[..., dict[str, torch.Tensor]]:
    from .ops import mrope_pto_correct

    def run(q, k, cos, sin, mrope_section):
        fn = mrope_pto_correct if kernel else reference.mrope_reference
        q_out, k_out = fn(q, k, cos, sin, mrope_section)
        return {"q_out": q_out, "k_out": k_out}

    return run


class _MLP(torch.nn.Module):
    """An HF-shaped gated MLP around case weights (nn.Linear stores [out, in])."""

    def __init__(self, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> None:
        super().__init__()
        h, i = w_gate.shape
        self.gate_proj = torch.nn.Linear(h, i, bias=False, dtype=w_gate.dtype)
        self.up_proj = torch.nn.Linear(h, i, bias=False, dtype=w_gate.dtype)
        self.down_proj = torch.nn.Linear(i, h, bias=False, dtype=w_gate.dtype)
        with torch.no_grad():
            self.gate_proj.weight.copy_(w_gate.t())
            self.up_proj.weight.copy_(w_up.t())
            self.down_proj.weight.copy_(w_down.t())
        self.act_fn = torch.nn.SiLU()


def _swiglu(kernel: bool) -> Callable[..., dict[str, torch.Tensor]]:
    from .ops import swiglu_mlp_wrapper

    def run(x, w_gate, w_up, w_down):
        if kernel:
            mlp = _MLP(w_gate, w_up, w_down)
            try:
                return {"y": swiglu_mlp_wrapper(mlp, x)}
            finally:
                PACKED.clear()
        return {"y": reference.swiglu_mlp_reference(x, w_gate, w_up, w_down)}

    return run


SUITE = PrecisionSuite(
    __package__ or "pypto_kernels_gutenocr",
    {"rms_norm": _rms, "mrope": _mrope, "swiglu_mlp": _swiglu},
)
load_document = SUITE.load_document
load_cases = SUITE.load_cases
golden = SUITE.golden
run_kernel = SUITE.run_kernel
