"""The wrappers inside torch.compile(fullgraph=True): what a captured decode step needs.

Switched-on ops are opaque custom ops, so the capture has no graph break and the
dispatch (kernel or counted fallback) runs on every replay, not once at trace time.
Shapes here are outside the kernels' envelope, so the dispatch's runtime path is the
counted reference: fast, and still the real custom-op route.
"""

from __future__ import annotations

import torch

from pypto_kernels_gutenocr import (
    mrope_pto_correct,
    pto_switches,
    rms_norm_wrapper,
    stats,
    swiglu_mlp_wrapper,
)
from pypto_kernels_gutenocr.reference import mrope_reference, rms_norm_reference


class _MLP(torch.nn.Module):
    def __init__(self, h: int = 48, i: int = 80) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(h, i, bias=False)
        self.up_proj = torch.nn.Linear(h, i, bias=False)
        self.down_proj = torch.nn.Linear(i, h, bias=False)
        self.act_fn = torch.nn.SiLU()


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, dynamic=False)


def test_switched_on_ops_compile_as_one_graph_and_dispatch_per_call():
    torch.manual_seed(0)
    x, w = torch.randn(1, 3, 48), torch.randn(48)
    mlp = _MLP()
    q, k = torch.randn(1, 2, 3, 16), torch.randn(1, 1, 3, 16)
    cos, sin = torch.randn(3, 1, 3, 16), torch.randn(3, 1, 3, 16)

    def step(x):
        h = rms_norm_wrapper(x, w, 1e-6)
        qo, ko = mrope_pto_correct(q, k, cos, sin, [2, 3, 3])
        return swiglu_mlp_wrapper(mlp, h), qo, ko

    with torch.no_grad(), pto_switches(rms_norm=True, mrope=True, swiglu_mlp=True):
        stats.reset()
        eager = step(x)
        fn = _compiled(step)
        fn(x)  # trace + first run
        stats.reset()
        out = fn(x)
        fn(x)
    calls = stats.calls()
    for op in ("rms_norm", "mrope", "swiglu_mlp"):
        assert calls[op]["reference"] == 2, calls  # counted at run time, every call
    for a, b in zip(out, eager, strict=True):
        torch.testing.assert_close(a, b)


def test_switched_off_ops_trace_as_the_plain_reference():
    torch.manual_seed(1)
    x, w = torch.randn(2, 48), torch.randn(48)
    q, k = torch.randn(1, 2, 3, 16), torch.randn(1, 1, 3, 16)
    cos, sin = torch.randn(3, 1, 3, 16), torch.randn(3, 1, 3, 16)
    with torch.no_grad(), pto_switches(rms_norm=False, mrope=False):
        fn = _compiled(
            lambda x: (rms_norm_wrapper(x, w, 1e-5), *mrope_pto_correct(q, k, cos, sin, [2, 3, 3]))
        )
        out = fn(x)
    torch.testing.assert_close(out[0], rms_norm_reference(x, w, 1e-5))
    ref_q, ref_k = mrope_reference(q, k, cos, sin, (2, 3, 3), 1)
    torch.testing.assert_close(out[1], ref_q)
    torch.testing.assert_close(out[2], ref_k)
