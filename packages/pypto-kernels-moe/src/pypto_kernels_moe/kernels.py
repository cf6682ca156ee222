# PyPTO's jit reads each parameter's annotation, a call (``pypto.Tensor((n, h), dt)``)
# that no type checker can read as a type; the rest of the file is checked.
# mypy: disable-error-code="valid-type"
"""The PyPTO grouped GEMM for MoE experts.

Why this shape of kernel: a decode step routes a few tokens to ``k`` experts each, so
the work is ``tokens * k`` small GEMVs against ``k`` expert weight slices chosen on the
device. The kernel reads each slot's expert id from the ``ids`` tensor as a symbolic
scalar (``ids[t, j]``, PyPTO's GetTensorData) and takes a *view* of that expert's slice
of the stacked weights at that offset: no host read-back, no copy of the weights, no
shape that depends on the routing. Every call of a given token count sees the same
shapes, which is what lets a captured step replay (the 507015 cause was a grouped GEMM
fed growing group sizes). One kernel launch replaces the per-expert loop.

Why two passes: the ``tokens * k`` slots are independent, so each is its own iteration
of a (token, slot) loop that the runtime spreads over the cores, writing its
routing-weighted contribution to a scratch row ``parts[t, j]``; a second, small pass
adds a token's k contributions in ascending j, the order and rounding of transformers'
loop. Summing inside one per-token iteration (the first version) made the runtime read
all k expert ids before any matmul started: 35k of its 301k simulated cycles at
MiniMax-M2 decode, against 9k for the (token, slot) loop.

Token count is a dynamic axis, so one compiled kernel serves decode and prefill; prefill
buckets (see :func:`token_bucket`) only bound how many distinct counts a capture sees.

No ``from __future__ import annotations`` here: the jit evaluates each parameter's
annotation. Nothing imports pypto at module import.
"""

import functools
import math
from types import ModuleType
from typing import Any

import torch

from pypto_kernels_common import Backend, Tiles

from .package import PACKAGE

__all__ = [
    "ACTIVATIONS",
    "EXPERT_MAJOR_TILES",
    "EXPERT_MAJOR_TILES_FP32",
    "GROUPED_TILES",
    "GROUPED_TILES_FP32",
    "PER_EXPERT_TILES",
    "backend",
    "cube_merge",
    "expert_major_kernel",
    "expert_major_tiles",
    "grouped_gemm_kernel",
    "grouped_tiles",
    "per_expert_kernel",
    "slot_loop",
    "token_bucket",
]

#: ``silu``: ``silu(g) * u`` (Qwen3-MoE, MiniMax M2, LLaDA2); ``gelu_tanh``:
#: ``gelu_tanh(g) * u`` (Gemma 4's MoE experts, ``gelu_pytorch_tanh``).
#: ``swigluoai``: MiniMax M3's clamped variant ``(clamp(u, -l, l) + 1) * g' * sigmoid(a g')``
#: with ``g' = clamp(g, max=l)``.
ACTIVATIONS = ("silu", "gelu_tanh", "swigluoai")
_GELU_2C = 2.0 * math.sqrt(2.0 / math.pi)

#: bf16/fp16 defaults, the best of the search in tools/bench_moe_costmodel.py (decode,
#: top-8; recorded in docs/benchmarks.md). Decode is GEMV-shaped (one row per slot), so
#: streaming the weights through L1 sets the time: 768 x 256 is the deepest L1 tile that
#: fits beside the row tile at 256 columns. The 1536-wide vector tile covers a
#: MiniMax-M2 intermediate row in one op and splits hidden 3072 in two for the final
#: sum. MiniMax-M2 118.5 us (first version: 167.3 us), LLaDA2.0-mini 69.8 us (85.5 us).
GROUPED_TILES = Tiles(
    rows=1, vec_rows=1, vec_cols=1536, cube_m=(16, 16), cube_k=(64, 768), cube_n=(256, 256)
)
#: L0B holds 64 KB and L1 512 KB: k0 x n x 4 and (16 + n) x k1 x 4 bytes must fit, so
#: fp32 halves the L1 depth (384 still divides 3072 and 1536).
GROUPED_TILES_FP32 = Tiles(
    rows=1, vec_rows=1, vec_cols=1536, cube_m=(16, 16), cube_k=(64, 384), cube_n=(256, 256)
)
#: The per-expert loop's own best tiles (the same search, one expert, one row): 128
#: columns give 24 gate/up tasks, one per cube core, and the deep L1 tile loads each
#: column block in two or fewer pieces. The benchmark models the loop with these.
PER_EXPERT_TILES = Tiles(
    rows=1, vec_rows=1, vec_cols=2048, cube_m=(16, 16), cube_k=(128, 1536), cube_n=(128, 128)
)
#: Cube cores of the simulated 910B-class array (PyPTO's lib/configs/A2A3.ini).
CUBE_CORES = 24
#: Most matmul tiles merged into one cube task (PyPTO's ``cube_nbuffer_setting``).
MAX_CUBE_MERGE = 4


def grouped_tiles(dtype: torch.dtype) -> Tiles:
    """Default tiles for an io dtype (cube buffers are sized in bytes)."""
    return GROUPED_TILES_FP32 if dtype == torch.float32 else GROUPED_TILES


def cube_merge(top_k: int, hidden: int, inter: int, cube_n: int) -> int:
    """How many matmul tiles the grouped kernel merges into one cube task.

    Why: a decode slot's GEMV is ``ceil(N / cube_n)`` tiles, each a cube task with a
    fixed start cost; merging amortises it. MiniMax-M2 at top-8 has 96 tiles per matmul:
    merged by 4 they fill the 24 cube cores in one wave (118.5 us; unmerged 159.5 us).
    Merging past one wave idles cores (LLaDA2.0-mini, 32 gate/up tiles: merged by 4,
    82.7 us; unmerged 69.8 us). Decided at one token; more tokens only add waves.
    """
    tiles = top_k * min(-(-2 * inter // cube_n), -(-hidden // cube_n))
    return max(1, min(MAX_CUBE_MERGE, tiles // CUBE_CORES))


#: Prefill token-count buckets: a captured prefill pads its tokens up to one of these.
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def token_bucket(tokens: int) -> int:
    """The smallest bucket holding ``tokens`` (padding rows carry zero routing weight)."""
    for b in BUCKETS:
        if tokens <= b:
            return b
    return tokens


def backend(device_type: str) -> Backend:
    """The PyPTO backend for tensors on ``device_type``; raises SimUnavailableError."""
    return PACKAGE.backend(device_type)


def _activate(pypto: ModuleType, g: Any, u: Any, act: str, alpha: float, limit: float) -> Any:
    # x * sigmoid(a x) as x / (1 + exp(-a x)): pypto.sigmoid builds its "ones" with the
    # tile's full shape, which breaks on a partial tile; this keeps the valid shape.
    if act == "silu":
        return pypto.div(g, pypto.add(pypto.exp(pypto.mul(g, -1.0)), 1.0)) * u
    if act == "gelu_tanh":
        # 0.5 g (1 + tanh(z)) = g * sigmoid(2 z), z = sqrt(2/pi) (g + 0.044715 g^3)
        z2 = pypto.mul(g + g * g * g * 0.044715, -_GELU_2C)
        return pypto.div(g, pypto.add(pypto.exp(z2), 1.0)) * u
    g = pypto.minimum(g, limit)
    u = pypto.minimum(pypto.maximum(u, -limit), limit)
    glu = pypto.div(g, pypto.add(pypto.exp(pypto.mul(g, -alpha)), 1.0))
    return (u + 1.0) * glu


def slot_loop(bk: Backend) -> bool:
    """Whether the grouped kernel runs as the (token, slot) loop on this backend.

    Why not on the CPU (SIM + verify): PyPTO 0.2.0's precision tool holds about three
    copies of every input per loop iteration, stacked weights included, so the
    (token, slot) loop's ``T * k`` iterations multiply the memory by k (MiniMax-M2
    decode with 16 stacked experts: 14.1 GB instead of 5.9 GB; LLaDA2.0-mini at 4 fp32
    tokens: 21.8 GB instead of 5.0 GB). There the kernel runs the same operations in a
    per-token loop (one iteration sums its k slots in ascending j), which
    tests/test_kernel.py checks bit for bit against the (token, slot) loop. The NPU and
    the cost model run the (token, slot) loop.
    """
    return bk.mode != "sim"


@functools.lru_cache(maxsize=32)
def grouped_gemm_kernel(
    bk: Backend,
    top_k: int,
    hidden: int,
    inter: int,
    experts: int,
    dtype: torch.dtype,
    act: str = "silu",
    alpha: float = 1.702,
    limit: float = 7.0,
    tiles: Tiles = GROUPED_TILES,
    slots: bool | None = None,
) -> Any:
    """out[t] = sum_j w[t, j] * down_e(act(gate_up_e(x[t]))), e = ids[t, j], j ascending.

    ``gate_up`` [E, 2I, H] and ``down`` [E, H, I] are transformers' fused experts layout
    (``[out, in]`` per expert), used in place with ``b_trans``. Tokens are dynamic.
    ``parts`` [T, k * H] is scratch (any contents): in the (token, slot) loop slot j of
    token t writes its contribution at columns ``j * H`` and a second pass sums them into
    ``out``. ``slots``: that loop (True) or the per-token one (False); None: the
    backend's choice, :func:`slot_loop`. Both compute the same operations in the same
    order.
    """
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    fp32 = pypto.DT_FP32
    n = pypto.frontend.dynamic("moe_tokens")
    vec_cols = min(inter, tiles.vec_cols)
    out_cols = min(hidden, tiles.vec_cols)
    merge = cube_merge(top_k, hidden, inter, tiles.cube_n[0])
    rest = list(range(1, top_k))

    def setup() -> None:
        # Outside the jit body: its parser reads every `if` there as a device branch.
        if merge > 1:
            pypto.set_pass_options(cube_nbuffer_setting={-1: merge})
        pypto.set_cube_tile_shapes(list(tiles.cube_m), list(tiles.cube_k), list(tiles.cube_n))

    def slot(x: Any, ids: Any, weights: Any, gate_up: Any, down: Any, t: Any, j: Any) -> Any:
        """Slot j of token t: its expert's MLP, weighted, rounded to the io dtype."""
        e = ids[t, j]
        w_gu = pypto.reshape(
            pypto.view(gate_up, [1, 2 * inter, hidden], [e, 0, 0]), [2 * inter, hidden]
        )
        w_dn = pypto.reshape(pypto.view(down, [1, hidden, inter], [e, 0, 0]), [hidden, inter])
        xv = pypto.view(x, [1, hidden], [t, 0])
        h = pypto.matmul(xv, w_gu, dt, b_trans=True)
        pypto.set_vec_tile_shapes(1, vec_cols)
        g = pypto.cast(pypto.view(h, [1, inter], [0, 0]), fp32)
        u = pypto.cast(pypto.view(h, [1, inter], [0, inter]), fp32)
        a = pypto.cast(_activate(pypto, g, u, act, alpha, limit), dt)
        y = pypto.matmul(a, w_dn, dt, b_trans=True)
        pypto.set_vec_tile_shapes(1, out_cols)
        wv = pypto.view(weights, [1, 1], [t, j])
        return pypto.cast(pypto.cast(y, fp32) * wv, dt)

    @pypto.frontend.jit(**bk.jit_options())
    def grouped_gemm_slots(
        x: pypto.Tensor((n, hidden), dt),
        ids: pypto.Tensor((n, top_k), pypto.DT_INT32),
        weights: pypto.Tensor((n, top_k), fp32),
        gate_up: pypto.Tensor((experts, 2 * inter, hidden), dt),
        down: pypto.Tensor((experts, hidden, inter), dt),
        parts: pypto.Tensor((n, top_k * hidden), dt),
        out: pypto.Tensor((n, hidden), dt),
    ):
        setup()
        for t in pypto.loop(n):
            for j in pypto.loop(top_k):
                c = slot(x, ids, weights, gate_up, down, t, j)
                pypto.assemble(c, [t, j * hidden], parts)
        for t in pypto.loop(n):
            pypto.set_vec_tile_shapes(1, out_cols)
            acc = pypto.view(parts, [1, hidden], [t, 0])
            for jj in rest:
                acc = acc + pypto.view(parts, [1, hidden], [t, jj * hidden])
            pypto.assemble(acc, [t, 0], out)

    @pypto.frontend.jit(**bk.jit_options())
    def grouped_gemm_tokens(
        x: pypto.Tensor((n, hidden), dt),
        ids: pypto.Tensor((n, top_k), pypto.DT_INT32),
        weights: pypto.Tensor((n, top_k), fp32),
        gate_up: pypto.Tensor((experts, 2 * inter, hidden), dt),
        down: pypto.Tensor((experts, hidden, inter), dt),
        parts: pypto.Tensor((n, top_k * hidden), dt),
        out: pypto.Tensor((n, hidden), dt),
    ):
        setup()
        for t in pypto.loop(n):
            acc = slot(x, ids, weights, gate_up, down, t, 0)
            for jj in rest:
                acc = acc + slot(x, ids, weights, gate_up, down, t, jj)
            pypto.set_vec_tile_shapes(1, out_cols)
            pypto.assemble(acc, [t, 0], out)

    use_slots = slot_loop(bk) if slots is None else slots
    return grouped_gemm_slots if use_slots else grouped_gemm_tokens


@functools.lru_cache(maxsize=32)
def per_expert_kernel(
    bk: Backend, hidden: int, inter: int, dtype: torch.dtype, tiles: Tiles = PER_EXPERT_TILES
) -> Any:
    """One expert's SwiGLU MLP over its routed rows: what the per-expert loop launches
    once per hit expert. Only the cost-model benchmark uses it."""
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    fp32 = pypto.DT_FP32
    n = pypto.frontend.dynamic("expert_rows")
    vec_cols = min(inter, tiles.vec_cols)

    @pypto.frontend.jit(**bk.jit_options())
    def expert_mlp(
        x: pypto.Tensor((n, hidden), dt),
        gate_up: pypto.Tensor((2 * inter, hidden), dt),
        down: pypto.Tensor((hidden, inter), dt),
        out: pypto.Tensor((n, hidden), dt),
    ):
        pypto.set_cube_tile_shapes(list(tiles.cube_m), list(tiles.cube_k), list(tiles.cube_n))
        for t in pypto.loop(n):
            xv = pypto.view(x, [1, hidden], [t, 0])
            h = pypto.matmul(xv, gate_up, dt, b_trans=True)
            pypto.set_vec_tile_shapes(1, vec_cols)
            g = pypto.cast(pypto.view(h, [1, inter], [0, 0]), fp32)
            u = pypto.cast(pypto.view(h, [1, inter], [0, inter]), fp32)
            a = pypto.cast(_activate(pypto, g, u, "silu", 1.702, 7.0), dt)
            pypto.assemble(pypto.matmul(a, down, dt, b_trans=True), [t, 0], out)

    return expert_mlp


#: Expert-major (prefill) defaults: ``rows`` is the row tile of one expert's GEMM (an
#: expert with more routed rows loops, re-reading its weights once per tile), so it is
#: sized for the busiest expert of a 512-token top-8 prefill over 256 experts (16 rows
#: on average); cube_m 64 lets one L0 tile hold them.
EXPERT_MAJOR_TILES = Tiles(
    rows=64, vec_rows=16, vec_cols=512, cube_m=(64, 64), cube_k=(128, 256), cube_n=(128, 128)
)
#: fp32: L0A/L0B hold half the 2-byte tile.
EXPERT_MAJOR_TILES_FP32 = Tiles(
    rows=64, vec_rows=16, vec_cols=512, cube_m=(64, 64), cube_k=(64, 128), cube_n=(128, 128)
)


def expert_major_tiles(dtype: torch.dtype) -> Tiles:
    """Default expert-major tiles for an io dtype."""
    return EXPERT_MAJOR_TILES_FP32 if dtype == torch.float32 else EXPERT_MAJOR_TILES


@functools.lru_cache(maxsize=32)
def expert_major_kernel(
    bk: Backend,
    hidden: int,
    inter: int,
    experts: int,
    dtype: torch.dtype,
    act: str = "silu",
    alpha: float = 1.702,
    limit: float = 7.0,
    tiles: Tiles = EXPERT_MAJOR_TILES,
) -> Any:
    """ys[p] = (w[p] * down_e(act(gate_up_e(xs[p])))).to(dtype) for the rows p of expert e.

    Why expert-major: a prefill of T tokens reads ``T * k`` expert slices token by token;
    here the routed rows arrive grouped by expert (``xs`` [P, H], P = T * k, rows of
    expert e at ``offsets[e] .. offsets[e + 1]``), so each expert's weights are read once
    per ``tiles.rows`` rows and multiplied against all its rows in one GEMM (M = its row
    count, a device-side valid shape). Offsets are read on the device (GetTensorData), so
    no routing-dependent shape reaches the kernel: P is fixed per token bucket, experts
    with no rows run no iteration, and slots past ``offsets[experts]`` (padding tokens)
    are never touched. ``ws`` [P, 1] is each row's routing weight (fp32).
    """
    pypto = bk.pypto
    dt = bk.dtype(dtype)
    fp32 = pypto.DT_FP32
    p = pypto.frontend.dynamic("moe_rows")
    tr = tiles.rows
    vec_cols = min(inter, tiles.vec_cols)
    out_cols = min(hidden, tiles.vec_cols)
    vec_rows = min(tr, tiles.vec_rows)

    @pypto.frontend.jit(**bk.jit_options())
    def expert_major(
        xs: pypto.Tensor((p, hidden), dt),
        ws: pypto.Tensor((p, 1), fp32),
        offsets: pypto.Tensor((experts + 1,), pypto.DT_INT32),
        gate_up: pypto.Tensor((experts, 2 * inter, hidden), dt),
        down: pypto.Tensor((experts, hidden, inter), dt),
        ys: pypto.Tensor((p, hidden), dt),
    ):
        pypto.set_cube_tile_shapes(list(tiles.cube_m), list(tiles.cube_k), list(tiles.cube_n))
        pypto.set_vec_tile_shapes(vec_rows, out_cols)
        for e in pypto.loop(experts):
            start = offsets[e]
            end = offsets[e + 1]
            w_gu = pypto.reshape(
                pypto.view(gate_up, [1, 2 * inter, hidden], [e, 0, 0]), [2 * inter, hidden]
            )
            w_dn = pypto.reshape(pypto.view(down, [1, hidden, inter], [e, 0, 0]), [hidden, inter])
            for r in pypto.loop((end - start + tr - 1) // tr):
                off = start + r * tr
                n = pypto.min(end - off, tr)
                xv = pypto.view(xs, [tr, hidden], [off, 0], valid_shape=[n, hidden])
                h = pypto.matmul(xv, w_gu, dt, b_trans=True)
                pypto.set_vec_tile_shapes(vec_rows, vec_cols)
                g = pypto.cast(pypto.view(h, [tr, inter], [0, 0], valid_shape=[n, inter]), fp32)
                u = pypto.cast(pypto.view(h, [tr, inter], [0, inter], valid_shape=[n, inter]), fp32)
                a = pypto.cast(_activate(pypto, g, u, act, alpha, limit), dt)
                y = pypto.matmul(a, w_dn, dt, b_trans=True)
                pypto.set_vec_tile_shapes(vec_rows, out_cols)
                wv = pypto.view(ws, [tr, 1], [off, 0], valid_shape=[n, 1])
                pypto.assemble(pypto.cast(pypto.cast(y, fp32) * wv, dt), [off, 0], ys)

    return expert_major
