"""Cost-model builders for the grouped GEMM and the per-expert loop it replaces.

Why a builder and not direct calls: pypto-kernels-common's :class:`Simulator` runs each
candidate in a worker process (a failed compile leaves pypto 0.2.0 broken in-process;
a poor tiling can simulate for minutes), and the worker imports the builder by name.
Inputs are zeros: cycles do not depend on data. Expert ids are ``0..k-1``; only the
selected experts are read, so ``experts`` (the stacked count) does not change cycles
and is kept small to spare memory.

Kernels: ``grouped`` (one launch, every token's k slots), ``per_expert`` (one launch of
one expert's MLP over its routed rows: the per-expert loop runs it once per hit expert).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from pypto_kernels_common import Backend, CostModelError, Simulator, tiles_from_dict

from .package import INSTALL_HINT

__all__ = ["BUILDER", "KERNELS", "MoESimulator", "build_call", "check_shape"]

KERNELS = ("grouped", "per_expert", "expert_major")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_SHAPE_KEYS = {
    "grouped": ("tokens", "top_k", "hidden", "inter"),
    "per_expert": ("rows", "hidden", "inter"),
    "expert_major": ("tokens", "top_k", "hidden", "inter", "experts"),
}


def check_shape(kernel: str, shape: Mapping[str, int], dtype: str) -> dict[str, int]:
    """The request as the builder needs it, or a one-line CostModelError."""
    if kernel not in KERNELS:
        raise CostModelError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    if dtype not in _DTYPES:
        raise CostModelError(f"unknown dtype {dtype!r}; choose one of {', '.join(_DTYPES)}")
    missing = [k for k in _SHAPE_KEYS[kernel] if k not in shape]
    if missing:
        raise CostModelError(f"{kernel} shape lacks {', '.join(missing)}")
    return {k: int(v) for k, v in shape.items()}


def build_call(
    bk: Backend, kernel: str, shape: Mapping[str, int], dtype: str, tiles: Mapping[str, Any]
) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    """The :class:`Simulator` worker's builder (``tiles`` as a JSON dict)."""
    from . import kernels

    t = tiles_from_dict(tiles)
    dt = _DTYPES[dtype]
    h, i = shape["hidden"], shape["inter"]
    if kernel == "grouped":
        n, k = shape["tokens"], shape["top_k"]
        e = max(k, shape.get("experts", k))
        fn = kernels.grouped_gemm_kernel(bk, k, h, i, e, dt, "silu", 1.702, 7.0, t)
        ids = torch.arange(k, dtype=torch.int32).repeat(n, 1)
        args: tuple[torch.Tensor, ...] = (
            torch.zeros(n, h, dtype=dt),
            ids,
            torch.zeros(n, k),
            torch.zeros(e, 2 * i, h, dtype=dt),
            torch.zeros(e, h, i, dtype=dt),
            torch.empty(n, k * h, dtype=dt),
            torch.empty(n, h, dtype=dt),
        )
        return fn, args
    if kernel == "expert_major":
        # Round-robin routing: every expert gets tokens * k / experts rows, the mean of a
        # balanced router (cycles depend on the row counts, not on the values).
        from .reference import expert_major_grouping

        n, k, e = shape["tokens"], shape["top_k"], shape["experts"]
        ids = (torch.arange(n * k) % e).view(n, k)
        g = expert_major_grouping(torch.zeros(n, h, dtype=dt), ids, torch.zeros(n, k), e)
        fn = kernels.expert_major_kernel(bk, h, i, e, dt, "silu", 1.702, 7.0, t)
        return fn, (
            g.xs,
            g.ws,
            g.offsets,
            torch.zeros(e, 2 * i, h, dtype=dt),
            torch.zeros(e, h, i, dtype=dt),
            torch.empty_like(g.xs),
        )
    rows = shape["rows"]
    fn = kernels.per_expert_kernel(bk, h, i, dt, t)
    args = (
        torch.zeros(rows, h, dtype=dt),
        torch.zeros(2 * i, h, dtype=dt),
        torch.zeros(h, i, dtype=dt),
        torch.empty(rows, h, dtype=dt),
    )
    return fn, args


BUILDER = f"{__name__}:build_call"


class MoESimulator(Simulator):
    """pypto-kernels-common's worker-process simulator, building this package's kernels."""

    def __init__(self, timeout_s: float = 600.0) -> None:
        super().__init__(BUILDER, timeout_s=timeout_s, install_hint=INSTALL_HINT)
