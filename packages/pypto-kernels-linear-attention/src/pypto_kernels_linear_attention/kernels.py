# PyPTO's jit reads each parameter's annotation, a call (``pypto.Tensor((n, h), dt)``)
# that no type checker can read as a type; the rest of the file is checked.
# mypy: disable-error-code="valid-type"
"""The PyPTO kernels: one decode step of a Gated DeltaNet layer and of a KDA layer.

Why one kernel per step: transformers' decode step of these layers is a chain of small
per-head operators (gate, decay, two l2norms, state decay, ``k^T S``, delta, outer-product
update, ``q^T S``, gated RMSNorm) and every one of them that touches the state reads
and writes ``[Dk, Dv]`` per head again. Here each head's state is read once into the
vector unit, decayed, updated and read out there, and written once.

Loop: one iteration per (batch, key head); the ``rep`` value heads sharing that key
head (Gated DeltaNet's grouping; 1 for KDA) are unrolled inside it, so q and k are
normalised once per key head, as the repeat_interleave they replace would have done
``rep`` times. Per value head, the state tile is ``[Dk, Dv]`` fp32 (64 KB at 128 x 128).

Why ``state`` and ``new_state`` are two parameters that the op binds to one tensor:
PyPTO 0.2.0 refuses a loop that views a parameter and assembles into the same
parameter (F21007 "Operation already in a group"; tests/test_kernel.py pins it). Each
iteration reads its heads' state blocks before it writes them, and no two iterations
touch the same block, so binding both to the cache's state tensor updates it in place.

Order of operations: transformers' (see :mod:`.reference`), including the io-dtype
roundings (``beta``, the read-out before the norm, Gated DeltaNet's normalised value
before its weight), so an fp32 model's tokens equal eager decode.

No ``from __future__ import annotations`` here: the jit evaluates each parameter's
annotation. Nothing imports pypto at module import.
"""

import functools
from types import ModuleType
from typing import Any

import torch

from pypto_kernels_common import Backend, Tiles

from .package import PACKAGE

__all__ = [
    "GATED_DELTA_TILES",
    "STEP_TILES",
    "backend",
    "gated_delta_step_kernel",
    "kda_step_kernel",
    "state_tiles",
    "step_tiles",
]

#: The state tile: ``vec_rows`` x ``vec_cols`` of the ``[Dk, Dv]`` fp32 head state
#: (clipped to the head). KDA's default: a whole 128 x 128 head (64 KB) as one tile,
#: 17.2 us at Kimi-Linear-48B-A3B in the cost model (half-head tiles: 125.7 / 147.2 us).
STEP_TILES = Tiles(rows=1, vec_rows=128, vec_cols=128)
#: Gated DeltaNet's default: half-width tiles. At Qwen3.5-9B / Qwen3.6-27B (bf16) the
#: cost model gives 44.2 / 46.5 us at 128 x 64, 51.0 / 54.6 at 64 x 64, and the whole
#: head fails to simulate at 9B (F7A001 in the machine model) and takes 69.7 us at 27B
#: (tools/bench_linear_attention_costmodel.py; docs/benchmarks.md).
GATED_DELTA_TILES = Tiles(rows=1, vec_rows=128, vec_cols=64)
QK_EPS = 1e-6


def backend(device_type: str) -> Backend:
    """The PyPTO backend for tensors on ``device_type``; raises SimUnavailableError."""
    return PACKAGE.backend(device_type)


def step_tiles(op: str) -> Tiles:
    """The default tiles of a step op (``gated_delta_step`` or ``kda_step``), every io
    dtype (the state is fp32 whatever the io dtype)."""
    return GATED_DELTA_TILES if op == "gated_delta_step" else STEP_TILES


def state_tiles(dk: int, dv: int, tiles: Tiles = STEP_TILES) -> tuple[int, int]:
    """The state's vector tile for a head of ``dk`` x ``dv``."""
    return min(dk, tiles.vec_rows), min(dv, tiles.vec_cols)


def _round(pypto: ModuleType, x: Any, dt: Any) -> Any:
    """``x.to(io).float()``: the io-dtype rounding transformers applies (none in fp32)."""
    if dt == pypto.DT_FP32:
        return x
    return pypto.cast(pypto.cast(x, dt), pypto.DT_FP32)


def _sigmoid(pypto: ModuleType, x: Any) -> Any:
    # 1 / (1 + exp(-x)); pypto.sigmoid builds its "ones" at the tile's full shape, which
    # breaks on a partial tile (see pypto-kernels-moe).
    return pypto.div(
        pypto.add(pypto.mul(x, 0.0), 1.0), pypto.add(pypto.exp(pypto.mul(x, -1.0)), 1.0)
    )


def _row(pypto: ModuleType, x: Any, n: int) -> Any:
    """``[1, 1] -> [1, n]`` (PyPTO broadcasts one axis per operand, so a per-head scalar
    meets the ``[Dk, Dv]`` state as a row)."""
    return pypto.expand_clone(x, [1, n])


def _delta_rule(
    pypto: ModuleType, s: Any, decay: Any, kc: Any, qc: Any, vf: Any, beta: Any
) -> tuple[Any, Any]:
    """New state and read-out of one head: ``decay`` is [1, Dv] (per head, a row of one
    value) or [Dk, 1] (per key channel); ``beta`` [1, 1] or [1, Dv]; ``kc``/``qc`` the
    normalised k and q as [Dk, 1] columns."""
    s = s * decay
    kv_mem = pypto.sum(s * kc, 0, True)
    delta = (vf - kv_mem) * beta
    s = s + kc * delta
    return s, pypto.sum(s * qc, 0, True)


@functools.lru_cache(maxsize=32)
def gated_delta_step_kernel(
    bk: Backend,
    batch: int,
    k_heads: int,
    v_heads: int,
    dk: int,
    dv: int,
    dtype: torch.dtype,
    eps: float,
    round_weight: bool,
    tiles: Tiles = GATED_DELTA_TILES,
) -> Any:
    """out, new_state = Gated DeltaNet step (see :func:`.reference.gated_delta_step_reference`).

    Parameters (2-D): ``q``/``k`` [B*Hk, Dk] and ``v``/``z`` [B*Hv, Dv] in the io dtype;
    ``a``/``b`` [B*Hv, 1] io; ``neg_a`` (``-exp(A_log)``) and ``dt_bias`` [Hv, 1] fp32;
    ``weight`` [1, Dv] fp32 (``round_weight``: the product is rounded to the io dtype, as
    ``weight(io) * x(io)`` is); ``state``/``new_state`` [B*Hv*Dk, Dv] fp32; ``out`` [B*Hv, Dv].
    """
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    fp32 = pypto.DT_FP32
    rep = v_heads // k_heads
    srows, scols = state_tiles(dk, dv, tiles)
    scale = dk**0.5

    @pypto.frontend.jit(**bk.jit_options())
    def gated_delta_step(
        q: pypto.Tensor((batch * k_heads, dk), dt),
        k: pypto.Tensor((batch * k_heads, dk), dt),
        v: pypto.Tensor((batch * v_heads, dv), dt),
        a: pypto.Tensor((batch * v_heads, 1), dt),
        b: pypto.Tensor((batch * v_heads, 1), dt),
        z: pypto.Tensor((batch * v_heads, dv), dt),
        neg_a: pypto.Tensor((v_heads, 1), fp32),
        dt_bias: pypto.Tensor((v_heads, 1), fp32),
        weight: pypto.Tensor((1, dv), fp32),
        state: pypto.Tensor((batch * v_heads * dk, dv), fp32),
        new_state: pypto.Tensor((batch * v_heads * dk, dv), fp32),
        out: pypto.Tensor((batch * v_heads, dv), dt),
    ):
        for bi in pypto.loop(batch):
            for kh in pypto.loop(k_heads):
                pypto.set_vec_tile_shapes(1, dk)
                qf = pypto.cast(pypto.view(q, [1, dk], [bi * k_heads + kh, 0]), fp32)
                kf = pypto.cast(pypto.view(k, [1, dk], [bi * k_heads + kh, 0]), fp32)
                qf = qf * pypto.rsqrt(pypto.sum(qf * qf, -1, True) + QK_EPS)
                kf = kf * pypto.rsqrt(pypto.sum(kf * kf, -1, True) + QK_EPS)
                qf = pypto.div(qf, scale)
                qc = pypto.transpose(qf, 0, 1)
                kc = pypto.transpose(kf, 0, 1)
                for r in range(rep):
                    h = kh * rep + r
                    i = bi * v_heads + h
                    # The head's gate and beta computed along a [1, Dv] row (every element
                    # the same value): under a (1, 1) tile each scalar op is a task of its
                    # own and the step took 52.2 us at Qwen3.5-9B, 44.2 us this way.
                    pypto.set_vec_tile_shapes(1, dv)
                    x = _row(pypto, pypto.cast(pypto.view(a, [1, 1], [i, 0]), fp32), dv)
                    x = x + _row(pypto, pypto.view(dt_bias, [1, 1], [h, 0]), dv)
                    sp = pypto.where(pypto.gt(x, 20.0), x, pypto.log1p(pypto.exp(x)))
                    decay = pypto.exp(_row(pypto, pypto.view(neg_a, [1, 1], [h, 0]), dv) * sp)
                    bf = _row(pypto, pypto.cast(pypto.view(b, [1, 1], [i, 0]), fp32), dv)
                    beta = _round(pypto, _sigmoid(pypto, bf), dt)
                    pypto.set_vec_tile_shapes(1, dv)
                    vf = pypto.cast(pypto.view(v, [1, dv], [i, 0]), fp32)
                    pypto.set_vec_tile_shapes(srows, scols)
                    s = pypto.view(state, [dk, dv], [i * dk, 0])
                    s, o = _delta_rule(pypto, s, decay, kc, qc, vf, beta)
                    pypto.assemble(s, [i * dk, 0], new_state)
                    pypto.set_vec_tile_shapes(1, dv)
                    o = _round(pypto, o, dt)
                    o = o * pypto.rsqrt(pypto.div(pypto.sum(o * o, -1, True), float(dv)) + eps)
                    y = _round(pypto, o, dt) * pypto.view(weight, [1, dv], [0, 0])
                    if round_weight:
                        y = _round(pypto, y, dt)
                    zf = pypto.cast(pypto.view(z, [1, dv], [i, 0]), fp32)
                    y = y * (zf * _sigmoid(pypto, zf))
                    pypto.assemble(pypto.cast(y, dt), [i, 0], out)

    return gated_delta_step


@functools.lru_cache(maxsize=32)
def kda_step_kernel(
    bk: Backend,
    batch: int,
    heads: int,
    dim: int,
    dtype: torch.dtype,
    eps: float,
    tiles: Tiles = STEP_TILES,
) -> Any:
    """out, new_state = KDA step (see :func:`.reference.kda_step_reference`).

    Parameters (2-D): ``q``/``k``/``v``/``g_raw``/``gate`` [B*H, D] in the io dtype;
    ``b`` [B*H, 1] io; ``neg_a`` (``-exp(A_log)``) [H, 1] fp32; ``dt_bias`` [H, D] fp32;
    ``weight`` [1, D] fp32; ``state``/``new_state`` [B*H*D, D] fp32; ``out`` [B*H, D].
    """
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    fp32 = pypto.DT_FP32
    srows, scols = state_tiles(dim, dim, tiles)
    scale = 1 / (dim**0.5)

    @pypto.frontend.jit(**bk.jit_options())
    def kda_step(
        q: pypto.Tensor((batch * heads, dim), dt),
        k: pypto.Tensor((batch * heads, dim), dt),
        v: pypto.Tensor((batch * heads, dim), dt),
        g_raw: pypto.Tensor((batch * heads, dim), dt),
        b: pypto.Tensor((batch * heads, 1), dt),
        gate: pypto.Tensor((batch * heads, dim), dt),
        neg_a: pypto.Tensor((heads, 1), fp32),
        dt_bias: pypto.Tensor((heads, dim), fp32),
        weight: pypto.Tensor((1, dim), fp32),
        state: pypto.Tensor((batch * heads * dim, dim), fp32),
        new_state: pypto.Tensor((batch * heads * dim, dim), fp32),
        out: pypto.Tensor((batch * heads, dim), dt),
    ):
        for bi in pypto.loop(batch):
            for h in pypto.loop(heads):
                i = bi * heads + h
                pypto.set_vec_tile_shapes(1, dim)
                qf = pypto.cast(pypto.view(q, [1, dim], [i, 0]), fp32)
                kf = pypto.cast(pypto.view(k, [1, dim], [i, 0]), fp32)
                qf = pypto.div(qf, pypto.sqrt(pypto.sum(qf * qf, -1, True) + QK_EPS))
                kf = pypto.div(kf, pypto.sqrt(pypto.sum(kf * kf, -1, True) + QK_EPS))
                qf = qf * scale
                g = pypto.cast(pypto.view(g_raw, [1, dim], [i, 0]), fp32) + pypto.view(
                    dt_bias, [1, dim], [h, 0]
                )
                sp = pypto.where(pypto.gt(g, 20.0), g, pypto.log(pypto.add(pypto.exp(g), 1.0)))
                g = pypto.exp(pypto.view(neg_a, [1, 1], [h, 0]) * sp)
                vf = pypto.cast(pypto.view(v, [1, dim], [i, 0]), fp32)
                pypto.set_vec_tile_shapes(1, 1)
                beta = _round(
                    pypto, _sigmoid(pypto, pypto.cast(pypto.view(b, [1, 1], [i, 0]), fp32)), dt
                )
                pypto.set_vec_tile_shapes(srows, scols)
                decay = pypto.transpose(g, 0, 1)
                s = pypto.view(state, [dim, dim], [i * dim, 0])
                s, o = _delta_rule(
                    pypto, s, decay, pypto.transpose(kf, 0, 1), pypto.transpose(qf, 0, 1), vf, beta
                )
                pypto.assemble(s, [i * dim, 0], new_state)
                pypto.set_vec_tile_shapes(1, dim)
                o = _round(pypto, o, dt)
                o = o * pypto.rsqrt(pypto.div(pypto.sum(o * o, -1, True), float(dim)) + eps)
                y = pypto.view(weight, [1, dim], [0, 0]) * o
                y = y * _sigmoid(pypto, pypto.cast(pypto.view(gate, [1, dim], [i, 0]), fp32))
                pypto.assemble(pypto.cast(y, dt), [i, 0], out)

    return kda_step
