"""The decode attention in PyPTO's cost model: fused kernel vs the unfused eager path.

Cycles are the cost model's "Total Cycles" (910B-class core array, 1.8 GHz): a
relative signal at fixed shapes, not an NPU time. Inputs are zeros: the simulated
cycles do not depend on the data.
"""

from __future__ import annotations

from typing import Any

import torch

from pypto_kernels_common import cost_backend
from pypto_kernels_common import costmodel as cm

from . import kernels
from .package import PACKAGE

__all__ = ["GEMMA4_31B_SLIDING", "compare_decode"]

#: google/gemma-4-31B-it's sliding layers at batch 1: 32 q heads over 16 KV heads,
#: head_dim 256, a full 1024-slot window.
GEMMA4_31B_SLIDING = kernels.DecodeShape(batch=1, heads=32, kv_heads=16, slots=1024, head_dim=256)


def _us(fn: Any, *args: Any) -> tuple[float, float]:
    cycles, wall = cm.measure(fn, *args)
    if cycles is None:
        raise RuntimeError("the cost model wrote no Total Cycles for a kernel call")
    return cycles / cm.CYCLES_PER_US, wall


def compare_decode(
    shape: kernels.DecodeShape = GEMMA4_31B_SLIDING, dtype: torch.dtype = torch.bfloat16
) -> list[dict[str, Any]]:
    """Simulated time of the fused decode kernel and of the three eager kernels.

    Both use the same default tiles for ``dtype`` (``kernels.decode_tiles``), so the
    difference is the fusion. Rows: ``{"kernel", "sim_us", "wall_s"}``; the last is the
    unfused total.
    """
    bk = cost_backend(PACKAGE.install_hint)
    b, h, kv, s, d = shape.batch, shape.heads, shape.kv_heads, shape.slots, shape.head_dim
    q = torch.zeros(b * h, d, dtype=dtype)
    k = torch.zeros(b * kv * s, d, dtype=dtype)
    v = torch.zeros_like(k)
    bias = torch.zeros(b, s)
    out = torch.empty_like(q)
    rows: list[dict[str, Any]] = []
    tiles = kernels.decode_tiles(dtype)
    us, wall = _us(kernels.gqa_decode_kernel(bk, shape, dtype, 1.0, tiles), q, k, v, bias, out)
    rows.append({"kernel": "gqa_decode (fused)", "sim_us": us, "wall_s": wall})
    scores_mm, row_softmax, value_mm = kernels.eager_split_kernels(bk, shape, dtype, 1.0, tiles)
    scores = torch.empty(b * h, s)
    probs = torch.empty(b * h, s, dtype=dtype)
    split = [
        ("eager: scores matmul", scores_mm, (q, k, bias, scores)),
        ("eager: softmax", row_softmax, (scores, probs)),
        ("eager: value matmul", value_mm, (probs, v, out)),
    ]
    total = 0.0
    for name, fn, args in split:
        us, wall = _us(fn, *args)
        total += us
        rows.append({"kernel": name, "sim_us": us, "wall_s": wall})
    rows.append({"kernel": "eager total (3 kernels)", "sim_us": total, "wall_s": None})
    return rows
