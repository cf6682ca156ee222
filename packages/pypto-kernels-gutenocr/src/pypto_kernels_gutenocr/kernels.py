# PyPTO's jit reads each parameter's annotation, a call (``pypto.Tensor((n, h), dt)``)
# that no type checker can read as a type; the rest of the file is checked.
# mypy: disable-error-code="valid-type"
"""The three PyPTO kernels (RMSNorm, MRoPE, fused SwiGLU MLP).

Kernels are built by factories keyed on the static parts of their shapes and
cached, because ``@pypto.frontend.jit`` fixes every non-dynamic dimension at
decoration time. Row counts (RMSNorm, SwiGLU) are dynamic axes looped over in
row tiles, so one kernel serves prefill and decode. MRoPE is specialised per
sequence length (its rotation mixes both halves of the head dim; a dynamic S
loop over 4-D views is not worth its complexity at these sizes).

Nothing here imports pypto at module import: :func:`backend` does, lazily,
through pypto-kernels-common's CPU shim or for a real NPU.
"""

import functools
from types import ModuleType
from typing import Any

import torch

from pypto_kernels_common import Backend, Tiles, npu_available

from .package import PACKAGE

__all__ = [
    "RMS_TILES",
    "SWIGLU_TILES",
    "SWIGLU_TILES_FP32",
    "Backend",
    "Tiles",
    "backend",
    "mrope_kernel",
    "npu_available",
    "rms_norm_kernel",
    "rms_tiles",
    "swiglu_mlp_kernel",
    "swiglu_split_kernels",
    "swiglu_tiles",
]

RMS_TILES = Tiles(rows=8, vec_rows=4)
SWIGLU_TILES = Tiles(
    rows=64, vec_rows=8, vec_cols=2048, cube_m=(32, 32), cube_k=(128, 512), cube_n=(256, 256)
)
# L0B holds 64 KB: k x n x 4 bytes must fit, so fp32 halves the bf16 n tile.
SWIGLU_TILES_FP32 = Tiles(
    rows=64, vec_rows=8, vec_cols=2048, cube_m=(32, 32), cube_k=(128, 128), cube_n=(128, 128)
)


def rms_tiles(dtype: torch.dtype) -> Tiles:
    """8-row vector tiles simulate 1.7x faster than 4 (docs/benchmarks.md); fp32 needs 4 to fit UB."""
    return RMS_TILES if dtype == torch.float32 else Tiles(rows=8, vec_rows=8)


def swiglu_tiles(dtype: torch.dtype) -> Tiles:
    """Default SwiGLU tiles for an io dtype (cube buffers are sized in bytes)."""
    return SWIGLU_TILES_FP32 if dtype == torch.float32 else SWIGLU_TILES


def backend(device_type: str) -> Backend:
    """The PyPTO backend for tensors on ``device_type`` (pypto-kernels-common's, with
    this package's install hint and ``$PYPTO_GUTENOCR_CPU_SIM``); raises SimUnavailableError."""
    return PACKAGE.backend(device_type)


# --------------------------------------------------------------------------- RMSNorm


@functools.lru_cache(maxsize=32)
def rms_norm_kernel(
    bk: Backend, hidden: int, dtype: torch.dtype, eps: float, tiles: Tiles = RMS_TILES
):
    """x [N, hidden] -> x * rsqrt(mean(x^2) + eps) * w, fp32 inside, N dynamic."""
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    fp32 = pypto.DT_FP32
    n = pypto.frontend.dynamic("rms_rows")
    tr = tiles.rows
    inv_h = 1.0 / hidden

    @pypto.frontend.jit(**bk.jit_options())
    def rms_norm(
        x: pypto.Tensor((n, hidden), dt),
        w: pypto.Tensor((hidden,), dt),
        out: pypto.Tensor((n, hidden), dt),
    ):
        pypto.set_vec_tile_shapes(tiles.vec_rows, min(hidden, tiles.vec_cols))
        wf = pypto.cast(pypto.reshape(w, [1, hidden]), fp32)
        for i in pypto.loop((n + tr - 1) // tr):
            off = i * tr
            end = pypto.min(off + tr, n)
            xv = pypto.view(x, [tr, hidden], [off, 0], valid_shape=[end - off, hidden])
            xf = pypto.cast(xv, fp32)
            mean = pypto.sum(xf * xf, -1, keepdim=True) * inv_h
            y = xf * pypto.rsqrt(mean + eps) * wf
            pypto.assemble(pypto.cast(y, dt), [off, 0], out)

    return rms_norm


# --------------------------------------------------------------------------- SwiGLU MLP


def _silu(pypto: ModuleType, x: Any) -> Any:
    # pypto.sigmoid builds its "ones" with the tile's full shape, which breaks on a
    # partial last row tile; x / (1 + exp(-x)) keeps the valid shape throughout.
    return pypto.div(x, pypto.add(pypto.exp(pypto.mul(x, -1.0)), 1.0))


@functools.lru_cache(maxsize=16)
def swiglu_mlp_kernel(
    bk: Backend, hidden: int, inter: int, dtype: torch.dtype, tiles: Tiles = SWIGLU_TILES
):
    """down(silu(x @ Wg) * (x @ Wu)) with packed [K, N] weights; N rows dynamic."""
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    fp32 = pypto.DT_FP32
    n = pypto.frontend.dynamic("mlp_rows")
    tm = tiles.rows

    @pypto.frontend.jit(**bk.jit_options())
    def swiglu_mlp(
        x: pypto.Tensor((n, hidden), dt),
        w_gate: pypto.Tensor((hidden, inter), dt),
        w_up: pypto.Tensor((hidden, inter), dt),
        w_down: pypto.Tensor((inter, hidden), dt),
        out: pypto.Tensor((n, hidden), dt),
    ):
        pypto.set_cube_tile_shapes(list(tiles.cube_m), list(tiles.cube_k), list(tiles.cube_n))
        for i in pypto.loop((n + tm - 1) // tm):
            off = i * tm
            end = pypto.min(off + tm, n)
            xv = pypto.view(x, [tm, hidden], [off, 0], valid_shape=[end - off, hidden])
            gate = pypto.matmul(xv, w_gate, fp32)
            up = pypto.matmul(xv, w_up, fp32)
            pypto.set_vec_tile_shapes(tiles.vec_rows, min(inter, tiles.vec_cols))
            act = _silu(pypto, gate) * up
            y = pypto.matmul(pypto.cast(act, dt), w_down, dt)
            pypto.assemble(y, [off, 0], out)

    return swiglu_mlp


def swiglu_split_kernels(
    bk: Backend, hidden: int, inter: int, dtype: torch.dtype, tiles: Tiles = SWIGLU_TILES
):
    """The same work as three separate kernels (gate/up matmuls, activation, down).

    Only the cost-model benchmark uses these: they show what fusing saves.
    """
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    fp32 = pypto.DT_FP32
    n = pypto.frontend.dynamic("split_rows")
    tm = tiles.rows

    @pypto.frontend.jit(**bk.jit_options())
    def gate_up(
        x: pypto.Tensor((n, hidden), dt),
        w_gate: pypto.Tensor((hidden, inter), dt),
        w_up: pypto.Tensor((hidden, inter), dt),
        g_out: pypto.Tensor((n, inter), dt),
        u_out: pypto.Tensor((n, inter), dt),
    ):
        pypto.set_cube_tile_shapes(list(tiles.cube_m), list(tiles.cube_k), list(tiles.cube_n))
        for i in pypto.loop((n + tm - 1) // tm):
            off = i * tm
            end = pypto.min(off + tm, n)
            xv = pypto.view(x, [tm, hidden], [off, 0], valid_shape=[end - off, hidden])
            pypto.assemble(pypto.matmul(xv, w_gate, dt), [off, 0], g_out)
            pypto.assemble(pypto.matmul(xv, w_up, dt), [off, 0], u_out)

    @pypto.frontend.jit(**bk.jit_options())
    def act(
        g: pypto.Tensor((n, inter), dt),
        u: pypto.Tensor((n, inter), dt),
        a_out: pypto.Tensor((n, inter), dt),
    ):
        pypto.set_vec_tile_shapes(tiles.vec_rows, min(inter, tiles.vec_cols))
        for i in pypto.loop((n + tm - 1) // tm):
            off = i * tm
            end = pypto.min(off + tm, n)
            gv = pypto.cast(
                pypto.view(g, [tm, inter], [off, 0], valid_shape=[end - off, inter]), fp32
            )
            uv = pypto.cast(
                pypto.view(u, [tm, inter], [off, 0], valid_shape=[end - off, inter]), fp32
            )
            pypto.assemble(pypto.cast(_silu(pypto, gv) * uv, dt), [off, 0], a_out)

    @pypto.frontend.jit(**bk.jit_options())
    def down(
        a: pypto.Tensor((n, inter), dt),
        w_down: pypto.Tensor((inter, hidden), dt),
        out: pypto.Tensor((n, hidden), dt),
    ):
        pypto.set_cube_tile_shapes(list(tiles.cube_m), list(tiles.cube_k), list(tiles.cube_n))
        for i in pypto.loop((n + tm - 1) // tm):
            off = i * tm
            end = pypto.min(off + tm, n)
            av = pypto.view(a, [tm, inter], [off, 0], valid_shape=[end - off, inter])
            pypto.assemble(pypto.matmul(av, w_down, dt), [off, 0], out)

    return gate_up, act, down


# --------------------------------------------------------------------------- MRoPE


def _mrope_plan(head_dim: int, sections: tuple[int, ...]) -> dict[str, list[Any]]:
    """Per rotated chunk: section axis (t, h, w), start, length, rotation partner, sign.

    The sections cover one half of the head dim; the second half repeats them. Lists, not
    tuples: the kernel parser unrolls loops over constant lists but cannot unpack tuples.
    """
    half = head_dim // 2
    chunks: list[tuple[int, int, int]] = []  # (axis, offset, length)
    off = 0
    for rep in range(2):
        for axis, length in enumerate(sections):
            chunks.append((axis, off, length))
            off += length
        assert off == half * (rep + 1)
    return {
        "ids": list(range(len(chunks))),
        "axes": [c[0] for c in chunks],
        "starts": [c[1] for c in chunks],
        "lengths": [c[2] for c in chunks],
        "partners": [c[1] + half if c[1] < half else c[1] - half for c in chunks],
        "signs": [-1.0 if c[1] < half else 1.0 for c in chunks],
    }


def _mrope_table(
    pypto: Any, tab: Any, axis: int, batch: int, seq: int, start: int, length: int
) -> Any:
    """One chunk of cos or sin [3, B, S, D], fp32, shaped to broadcast over heads."""
    t = pypto.cast(pypto.view(tab, [1, batch, seq, length], [axis, 0, 0, start]), pypto.DT_FP32)
    return pypto.reshape(t, [batch, 1, seq, length])


def _mrope_rotated(
    pypto: Any, x: Any, heads: int, c: Any, s: Any, batch: int, seq: int, chunk: list[Any], dt: Any
) -> Any:
    """``x * cos + partner(x) * sin * sign`` for one chunk, cast back to the io dtype."""
    start, length, partner, sign = chunk
    fp32 = pypto.DT_FP32
    xx = pypto.cast(pypto.view(x, [batch, heads, seq, length], [0, 0, 0, start]), fp32)
    xy = pypto.cast(pypto.view(x, [batch, heads, seq, length], [0, 0, 0, partner]), fp32)
    return pypto.cast(xx * c + xy * s * sign, dt)


@functools.lru_cache(maxsize=64)
def mrope_kernel(
    bk: Backend,
    batch: int,
    q_heads: int,
    k_heads: int,
    seq: int,
    head_dim: int,
    sections: tuple[int, ...],
    dtype: torch.dtype,
):
    """Rotate q and k with cos/sin [3, B, S, D] chosen per mrope section (t, h, w)."""
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    plan = _mrope_plan(head_dim, sections)
    chunk_ids, axes, starts, lengths = plan["ids"], plan["axes"], plan["starts"], plan["lengths"]
    chunks = [
        [st, ln, pa, sg]
        for st, ln, pa, sg in zip(starts, lengths, plan["partners"], plan["signs"], strict=True)
    ]

    @pypto.frontend.jit(**bk.jit_options())
    def mrope(
        q: pypto.Tensor((batch, q_heads, seq, head_dim), dt),
        k: pypto.Tensor((batch, k_heads, seq, head_dim), dt),
        cos: pypto.Tensor((3, batch, seq, head_dim), dt),
        sin: pypto.Tensor((3, batch, seq, head_dim), dt),
        q_out: pypto.Tensor((batch, q_heads, seq, head_dim), dt),
        k_out: pypto.Tensor((batch, k_heads, seq, head_dim), dt),
    ):
        pypto.set_vec_tile_shapes(1, 1, min(seq, 64), 64)
        for ci in chunk_ids:
            axis = axes[ci]
            start = starts[ci]
            length = lengths[ci]
            chunk = chunks[ci]
            c = _mrope_table(pypto, cos, axis, batch, seq, start, length)
            s = _mrope_table(pypto, sin, axis, batch, seq, start, length)
            q_rot = _mrope_rotated(pypto, q, q_heads, c, s, batch, seq, chunk, dt)
            pypto.assemble(q_rot, [0, 0, 0, start], q_out)
            k_rot = _mrope_rotated(pypto, k, k_heads, c, s, batch, seq, chunk, dt)
            pypto.assemble(k_rot, [0, 0, 0, start], k_out)

    return mrope


# --------------------------------------------------------------------------- unfused (cost model)


def rms_norm_split_kernels(
    bk: Backend, hidden: int, dtype: torch.dtype, eps: float, tiles: Tiles = RMS_TILES
):
    """RMSNorm as two kernels: per-row rstd (fp32 [N, 1]), then ``x * rstd * w``.

    Only the cost-model policy tool uses these: the unfused side of the comparison. Two
    launches is a lower bound of eager torch's seven (cast, pow, mean, add, rsqrt, mul,
    mul), so the fused kernel's measured saving is, if anything, understated.
    """
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    fp32 = pypto.DT_FP32
    n = pypto.frontend.dynamic("rms_split_rows")
    tr = tiles.rows
    inv_h = 1.0 / hidden

    @pypto.frontend.jit(**bk.jit_options())
    def rms_stats(x: pypto.Tensor((n, hidden), dt), rstd: pypto.Tensor((n, 1), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(tiles.vec_rows, min(hidden, tiles.vec_cols))
        for i in pypto.loop((n + tr - 1) // tr):
            off = i * tr
            end = pypto.min(off + tr, n)
            xf = pypto.cast(
                pypto.view(x, [tr, hidden], [off, 0], valid_shape=[end - off, hidden]), fp32
            )
            mean = pypto.sum(xf * xf, -1, keepdim=True) * inv_h
            pypto.assemble(pypto.rsqrt(mean + eps), [off, 0], rstd)

    @pypto.frontend.jit(**bk.jit_options())
    def rms_apply(
        x: pypto.Tensor((n, hidden), dt),
        rstd: pypto.Tensor((n, 1), pypto.DT_FP32),
        w: pypto.Tensor((hidden,), dt),
        out: pypto.Tensor((n, hidden), dt),
    ):
        pypto.set_vec_tile_shapes(tiles.vec_rows, min(hidden, tiles.vec_cols))
        wf = pypto.cast(pypto.reshape(w, [1, hidden]), fp32)
        for i in pypto.loop((n + tr - 1) // tr):
            off = i * tr
            end = pypto.min(off + tr, n)
            xf = pypto.cast(
                pypto.view(x, [tr, hidden], [off, 0], valid_shape=[end - off, hidden]), fp32
            )
            r = pypto.view(rstd, [tr, 1], [off, 0], valid_shape=[end - off, 1])
            pypto.assemble(pypto.cast(xf * r * wf, dt), [off, 0], out)

    return rms_stats, rms_apply


@functools.lru_cache(maxsize=64)
def rope_one_kernel(
    bk: Backend,
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    sections: tuple[int, ...],
    dtype: torch.dtype,
):
    """One tensor's MRoPE rotation (q or k alone): the unfused side, launched once per tensor.

    Only the cost-model policy tool uses it; :func:`mrope_kernel` rotates q and k in one.
    """
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    plan = _mrope_plan(head_dim, sections)
    chunk_ids, axes, starts, lengths = plan["ids"], plan["axes"], plan["starts"], plan["lengths"]
    chunks = [
        [st, ln, pa, sg]
        for st, ln, pa, sg in zip(starts, lengths, plan["partners"], plan["signs"], strict=True)
    ]

    @pypto.frontend.jit(**bk.jit_options())
    def rope_one(
        x: pypto.Tensor((batch, heads, seq, head_dim), dt),
        cos: pypto.Tensor((3, batch, seq, head_dim), dt),
        sin: pypto.Tensor((3, batch, seq, head_dim), dt),
        x_out: pypto.Tensor((batch, heads, seq, head_dim), dt),
    ):
        pypto.set_vec_tile_shapes(1, 1, min(seq, 64), 64)
        for ci in chunk_ids:
            axis = axes[ci]
            start = starts[ci]
            length = lengths[ci]
            c = _mrope_table(pypto, cos, axis, batch, seq, start, length)
            s = _mrope_table(pypto, sin, axis, batch, seq, start, length)
            x_rot = _mrope_rotated(pypto, x, heads, c, s, batch, seq, chunks[ci], dt)
            pypto.assemble(x_rot, [0, 0, 0, start], x_out)

    return rope_one
