"""The precision suite: ``precision_cases.json`` run through the op and its reference.

Cases give router logits rather than expert ids: the runner routes them the way
MiniMax M2 and LLaDA2 do (sigmoid scores, top-k, renormalised, times the routed scaling
factor), which yields distinct ids per token as a real router does (random integer ids
would repeat within a token, which no model produces).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pypto_kernels_common import PrecisionSuite

from .ops import grouped_gemm
from .package import PACKAGE
from .reference import grouped_gemm_reference

__all__ = ["SUITE", "golden", "load_cases", "load_document", "route", "run_kernel"]


def route(
    router_logits: torch.Tensor, top_k: int, routed_scaling: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid router: (ids [T, k], fp32 weights [T, k]) as MiniMax M2 / LLaDA2 route."""
    scores = torch.sigmoid(router_logits.float())
    weights, ids = torch.topk(scores, top_k, dim=-1, sorted=False)
    weights = weights / weights.sum(-1, keepdim=True)
    return ids, weights * routed_scaling


def _grouped_gemm(kernel: bool) -> Callable[..., dict[str, torch.Tensor]]:
    def run(
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        top_k: int,
        act: str = "silu",
        routed_scaling: float = 1.0,
    ) -> dict[str, torch.Tensor]:
        ids, weights = route(router_logits, int(top_k), float(routed_scaling))
        if kernel:
            with PACKAGE.switches.pto_switches(grouped_gemm=True):
                return {"y": grouped_gemm(hidden_states, ids, weights, gate_up, down, act)}
        return {"y": grouped_gemm_reference(hidden_states, ids, weights, gate_up, down, act)}

    return run


SUITE = PrecisionSuite(__package__ or "pypto_kernels_moe", {"grouped_gemm": _grouped_gemm})
load_document = SUITE.load_document
load_cases = SUITE.load_cases
golden = SUITE.golden
run_kernel = SUITE.run_kernel
