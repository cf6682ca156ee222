# PyPTO's jit reads each parameter's annotation, a call (``pypto.Tensor((n, h), dt)``)
# that no type checker can read as a type; the rest of the file is checked.
# mypy: disable-error-code="valid-type"
"""The PyPTO kernels: GQA decode attention and the row softmax.

Factories are cached on the backend and the static shape parts, because
``@pypto.frontend.jit`` fixes every non-dynamic dimension at decoration time. The
decode kernel is specialised per cache shape: the cache is static by design (that is
what makes the step replayable), so one build serves every decode step.

Tensors are passed flattened to 2-D (``q [B*H, D]``, ``k/v [B*KV*S, D]``,
``out [B*H, D]``) so each (batch, KV head) pair is one pair of 2-D views: a
``[G, D] x [D, S]`` score matmul for the ``G = H // KV`` query heads sharing that KV
head, the masked softmax on the vector unit, and a ``[G, S] x [S, D]`` value matmul.
No ``from __future__ import annotations``: the jit evaluates the annotations.
"""

import functools
from dataclasses import dataclass
from typing import Any

import torch

from pypto_kernels_common import Backend

__all__ = [
    "DECODE_TILES",
    "DECODE_TILES_16BIT",
    "DECODE_TILES_FP32",
    "DecodeShape",
    "DecodeTiles",
    "decode_tiles",
    "eager_split_kernels",
    "gqa_decode_kernel",
    "softmax_kernel",
]


@dataclass(frozen=True)
class DecodeShape:
    """The static shape of one decode-attention build."""

    batch: int
    heads: int
    kv_heads: int
    slots: int
    head_dim: int

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


@dataclass(frozen=True)
class DecodeTiles:
    """Cube tiles for the two matmuls and the vector tile width of the softmax.

    The defaults keep both matmuls' L0 buffers within the 910B limits for fp32 at
    head_dim 256 (k x n x 4 bytes <= 64 KB for L0B).
    """

    cube_m: tuple[int, int] = (16, 16)
    cube_k: tuple[int, int] = (64, 64)
    cube_n: tuple[int, int] = (128, 128)
    vec_cols: int = 1024


DECODE_TILES = DecodeTiles()
# 2-byte io: 256 x 128 x 2 bytes fills L0B exactly. At Gemma-4-31B sliding shapes (bf16)
# the cost model gives 130 us with DECODE_TILES, 105 with n=256, 72 with k=128/n=256 and
# 69 with k=256/n=128 (tools/bench_attention_costmodel.py; the search is in the README).
DECODE_TILES_16BIT = DecodeTiles(cube_k=(256, 256), cube_n=(128, 128))
# fp32: 128 x 128 x 4 bytes is the largest L0B tile.
DECODE_TILES_FP32 = DecodeTiles(cube_k=(128, 128), cube_n=(128, 128))


def decode_tiles(dtype: torch.dtype) -> DecodeTiles:
    """The default tiles for an io dtype (cube buffers are sized in bytes)."""
    return DECODE_TILES_FP32 if dtype == torch.float32 else DECODE_TILES_16BIT


@functools.lru_cache(maxsize=32)
def gqa_decode_kernel(
    bk: Backend,
    shape: DecodeShape,
    dtype: torch.dtype,
    scaling: float,
    tiles: DecodeTiles = DECODE_TILES,
) -> Any:
    """softmax(q k^T * scaling + bias) v per (batch, KV head), fp32 scores inside."""
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    fp32 = pypto.DT_FP32
    b_n, h_n, kv_n, s_n, d_n = shape.batch, shape.heads, shape.kv_heads, shape.slots, shape.head_dim
    g_n = shape.group
    scale = float(scaling)

    @pypto.frontend.jit(**bk.jit_options())
    def gqa_decode(
        q: pypto.Tensor((b_n * h_n, d_n), dt),
        k: pypto.Tensor((b_n * kv_n * s_n, d_n), dt),
        v: pypto.Tensor((b_n * kv_n * s_n, d_n), dt),
        bias: pypto.Tensor((b_n, s_n), fp32),
        out: pypto.Tensor((b_n * h_n, d_n), dt),
    ):
        pypto.set_cube_tile_shapes(list(tiles.cube_m), list(tiles.cube_k), list(tiles.cube_n))
        pypto.set_vec_tile_shapes(g_n, min(s_n, tiles.vec_cols))
        for b in pypto.loop(b_n):
            row_bias = pypto.view(bias, [1, s_n], [b, 0])
            for g in pypto.loop(kv_n):
                q_off = b * h_n + g * g_n
                kv_off = (b * kv_n + g) * s_n
                qv = pypto.view(q, [g_n, d_n], [q_off, 0])
                kv = pypto.view(k, [s_n, d_n], [kv_off, 0])
                vv = pypto.view(v, [s_n, d_n], [kv_off, 0])
                scores = pypto.matmul(qv, kv, fp32, b_trans=True)
                scores = scores * scale + row_bias
                top = pypto.amax(scores, -1, True)
                e = pypto.exp(scores - top)
                probs = e / pypto.sum(e, -1, True)
                o = pypto.matmul(pypto.cast(probs, dt), vv, dt)
                pypto.assemble(o, [q_off, 0], out)

    return gqa_decode


@functools.lru_cache(maxsize=32)
def softmax_kernel(
    bk: Backend, cols: int, dtype: torch.dtype, rows_per_step: int = 8, vec_rows: int = 8
) -> Any:
    """Row softmax of ``x [N, cols]`` (N dynamic), fp32 inside, the input dtype out."""
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    fp32 = pypto.DT_FP32
    n = pypto.frontend.dynamic("softmax_rows")
    tr = rows_per_step

    @pypto.frontend.jit(**bk.jit_options())
    def softmax(x: pypto.Tensor((n, cols), dt), out: pypto.Tensor((n, cols), dt)):
        pypto.set_vec_tile_shapes(vec_rows, cols)
        for i in pypto.loop((n + tr - 1) // tr):
            off = i * tr
            end = pypto.min(off + tr, n)
            xv = pypto.view(x, [tr, cols], [off, 0], valid_shape=[end - off, cols])
            xf = pypto.cast(xv, fp32)
            e = pypto.exp(xf - pypto.amax(xf, -1, True))
            pypto.assemble(pypto.cast(e / pypto.sum(e, -1, True), dt), [off, 0], out)

    return softmax


def eager_split_kernels(
    bk: Backend,
    shape: DecodeShape,
    dtype: torch.dtype,
    scaling: float,
    tiles: DecodeTiles = DECODE_TILES,
) -> Any:
    """The unfused eager attention as three kernels (scores matmul, softmax, value matmul).

    Only the cost-model benchmark uses these: they are what the decode kernel fuses.
    Scores travel through memory as fp32 ``[B*H, S]`` between the kernels, as eager's do.
    """
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    fp32 = pypto.DT_FP32
    b_n, h_n, kv_n, s_n, d_n = shape.batch, shape.heads, shape.kv_heads, shape.slots, shape.head_dim
    g_n = shape.group
    t = tiles
    scale = float(scaling)

    @pypto.frontend.jit(**bk.jit_options())
    def scores_mm(
        q: pypto.Tensor((b_n * h_n, d_n), dt),
        k: pypto.Tensor((b_n * kv_n * s_n, d_n), dt),
        bias: pypto.Tensor((b_n, s_n), fp32),
        scores: pypto.Tensor((b_n * h_n, s_n), fp32),
    ):
        pypto.set_cube_tile_shapes(list(t.cube_m), list(t.cube_k), list(t.cube_n))
        pypto.set_vec_tile_shapes(g_n, min(s_n, t.vec_cols))
        for b in pypto.loop(b_n):
            row_bias = pypto.view(bias, [1, s_n], [b, 0])
            for g in pypto.loop(kv_n):
                q_off = b * h_n + g * g_n
                kv = pypto.view(k, [s_n, d_n], [(b * kv_n + g) * s_n, 0])
                qv = pypto.view(q, [g_n, d_n], [q_off, 0])
                sc = pypto.matmul(qv, kv, fp32, b_trans=True) * scale + row_bias
                pypto.assemble(sc, [q_off, 0], scores)

    @pypto.frontend.jit(**bk.jit_options())
    def row_softmax(
        scores: pypto.Tensor((b_n * h_n, s_n), fp32),
        probs: pypto.Tensor((b_n * h_n, s_n), dt),
    ):
        pypto.set_vec_tile_shapes(g_n, min(s_n, t.vec_cols))
        for r in pypto.loop(b_n * kv_n):
            sv = pypto.view(scores, [g_n, s_n], [r * g_n, 0])
            e = pypto.exp(sv - pypto.amax(sv, -1, True))
            pypto.assemble(pypto.cast(e / pypto.sum(e, -1, True), dt), [r * g_n, 0], probs)

    @pypto.frontend.jit(**bk.jit_options())
    def value_mm(
        probs: pypto.Tensor((b_n * h_n, s_n), dt),
        v: pypto.Tensor((b_n * kv_n * s_n, d_n), dt),
        out: pypto.Tensor((b_n * h_n, d_n), dt),
    ):
        pypto.set_cube_tile_shapes(list(t.cube_m), list(t.cube_k), list(t.cube_n))
        for b in pypto.loop(b_n):
            for g in pypto.loop(kv_n):
                q_off = b * h_n + g * g_n
                pv = pypto.view(probs, [g_n, s_n], [q_off, 0])
                vv = pypto.view(v, [s_n, d_n], [(b * kv_n + g) * s_n, 0])
                pypto.assemble(pypto.matmul(pv, vv, dt), [q_off, 0], out)

    return scores_mm, row_softmax, value_mm
