# PyPTO's jit reads each parameter's annotation, a call (``pypto.Tensor((n, h), dt)``)
# that no type checker can read as a type; the rest of the file is checked.
# mypy: disable-error-code="valid-type"
"""Cost-model builders for the fused decode steps and the unfused operator chain they replace.

Why a builder and not direct calls: pypto-kernels-common's :class:`Simulator` runs each
candidate in a worker process (a failed compile leaves pypto 0.2.0 broken in-process;
a poor tiling can simulate for minutes), and the worker imports the builder by name.
Inputs are zeros: cycles do not depend on data.

Kernels: ``gated_delta_step`` and ``kda_step`` (one launch each, :mod:`.kernels`), and
the unfused chain, one kernel name per stage (``gated_delta.<stage>``, ``kda.<stage>``,
listed in :data:`CHAINS`; :func:`chain` gives the stages of one request). The chain is
what eager transformers launches for one decode step of one layer (:mod:`.reference`
spells the operators out): one launch per torch operator, each a small PyPTO kernel
over all heads that reads its operands from global memory and writes its result there;
its time is the sum of its stages' simulations. Every operator that touches the state
is its own stage, so the chain moves the ``[Dk, Dv]`` fp32 head state as eager does
(decay: read + write; ``S * k``: read + write; column sum: read; ``k * delta``: write;
``S + k delta``: 2 reads + write; ``S * q``: read + write; column sum: read: 7 reads and
5 writes of the state, the fused step 1 and 1). The small per-head pointwise operators
are grouped into stages (:data:`STAGE_OPS` says which torch operators each stands for
and how many): a grouped stage pays one launch for several, which favours the chain.
Not modelled, also in the chain's favour: ``initial_state.to(value)`` (fp32 already),
``transpose(1, 2).contiguous()`` of one-token tensors (no copy), ``torch.zeros`` of the
output, and the host work between launches.

Tiles: the fused steps and the state stages take ``vec_rows`` x ``vec_cols`` (the state
tile, :func:`.kernels.state_tiles`), the per-head row stages ``rows`` heads per task
(:func:`row_group`); :func:`stage_tiling` says which, so a search varies only what a
stage reads (each stage may take its own best).

No ``from __future__ import annotations`` here: the jit evaluates each parameter's
annotation. Nothing imports pypto at module import.
"""

from collections.abc import Callable, Mapping
from typing import Any

import torch

from pypto_kernels_common import Backend, CostModelError, Simulator, Tiles, tiles_from_dict

from .kernels import QK_EPS, STEP_TILES, state_tiles
from .package import INSTALL_HINT

__all__ = [
    "BUILDER",
    "CHAINS",
    "KERNELS",
    "NORM_EPS",
    "STAGE_OPS",
    "LinearAttentionSimulator",
    "build_call",
    "chain",
    "chain_stage",
    "check_shape",
    "io_bytes",
    "row_group",
    "stage_tiling",
    "state_bytes",
]

#: Each chain stage: (name, the eager torch operators it stands for, how many).
_GDN_CHAIN = (
    ("beta", "sigmoid(b)", 1),
    ("gate", "a.float(), + dt_bias, softplus, -A_log.exp() (exp, neg), *", 6),
    ("decay_exp", "g.exp()", 1),
    ("repeat_q", "q.repeat_interleave over the value heads", 1),
    ("repeat_k", "k.repeat_interleave over the value heads", 1),
    ("l2norm_q", "q.float(), q * q, sum, + eps, rsqrt, q * inv", 6),
    ("l2norm_k", "k.float(), k * k, sum, + eps, rsqrt, k * inv", 6),
    ("q_scale", "q / sqrt(Dk)", 1),
    ("cast_v", "v.float()", 1),
    ("cast_beta", "beta.float()", 1),
    ("state_decay", "S * exp(g) (state read + write)", 1),
    ("state_k", "S * k.unsqueeze(-1) (state read + write)", 1),
    ("kv_mem", ".sum(-2) (state read)", 1),
    ("delta", "(v - kv_mem) * beta", 2),
    ("outer", "k.unsqueeze(-1) * delta.unsqueeze(-2) (state write)", 1),
    ("state_add", "S + k delta (2 state reads + write)", 1),
    ("state_q", "S * q.unsqueeze(-1) (state read + write)", 1),
    ("readout", ".sum(-2) (state read)", 1),
    ("store_out", "core_attn_out[:, :, i] = o", 1),
    ("cast_out", "core_attn_out.to(io)", 1),
    ("rmsnorm", ".float(), pow(2), mean, + eps, rsqrt, *, .to(io)", 7),
    ("norm_weight", "weight * h", 1),
    ("silu_gate", "z.float(), silu, *, .to(io)", 4),
)
_KDA_CHAIN = (
    ("beta", "sigmoid(b)", 1),
    ("gate", "g.float(), + dt_bias, > 20, exp, 1 +, log, where, -A_log.exp() (exp, neg), *", 10),
    ("decay_exp", "g.exp()", 1),
    ("l2norm_q", "q.float(), q * q, sum, + eps, sqrt, q / norm", 6),
    ("l2norm_k", "k.float(), k * k, sum, + eps, sqrt, k / norm", 6),
    ("q_scale", "q * D^-0.5", 1),
    ("cast_v", "v.float()", 1),
    ("cast_beta", "beta.float()", 1),
    ("state_decay", "S * exp(g).unsqueeze(-1) (state read + write)", 1),
    ("state_k", "S * k.unsqueeze(-1) (state read + write)", 1),
    ("kv_mem", ".sum(-2) (state read)", 1),
    ("delta", "(v - kv_mem) * beta", 2),
    ("outer", "k.unsqueeze(-1) * delta.unsqueeze(-2) (state write)", 1),
    ("state_add", "S + k delta (2 state reads + write)", 1),
    ("state_q", "S * q.unsqueeze(-1) (state read + write)", 1),
    ("readout", ".sum(-2) (state read)", 1),
    ("store_out", "core_attn_out[:, :, i] = o", 1),
    ("cast_out", "core_attn_out.to(io)", 1),
    ("rmsnorm", ".float(), pow(2), mean, + eps, rsqrt, *", 6),
    ("norm_weight", "weight * h", 1),
    ("sigmoid_gate", "gate.float(), sigmoid, *, .to(io)", 4),
)

#: The unfused chain of each fused kernel: its stage kernel names, in launch order.
CHAINS = {
    "gated_delta_step": tuple(f"gated_delta.{s}" for s, _, _ in _GDN_CHAIN),
    "kda_step": tuple(f"kda.{s}" for s, _, _ in _KDA_CHAIN),
}
#: Stage kernel name -> (what it computes, how many eager torch operators it stands for).
STAGE_OPS = {
    **{f"gated_delta.{s}": (what, n) for s, what, n in _GDN_CHAIN},
    **{f"kda.{s}": (what, n) for s, what, n in _KDA_CHAIN},
}
KERNELS = ("gated_delta_step", "kda_step", *CHAINS["gated_delta_step"], *CHAINS["kda_step"])

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_SHAPE_KEYS = {
    "gated_delta_step": ("batch", "k_heads", "v_heads", "dk", "dv"),
    "kda_step": ("batch", "heads", "dim"),
}
#: The gated norms' epsilon in the simulated calls (cycles do not depend on it).
NORM_EPS = 1e-6


def _family(kernel: str) -> str:
    return "gated_delta_step" if kernel.startswith("gated_delta") else "kda_step"


def check_shape(kernel: str, shape: Mapping[str, int], dtype: str) -> dict[str, int]:
    """The request as the builder needs it, or a one-line CostModelError."""
    if kernel not in KERNELS:
        raise CostModelError(
            f"unknown kernel {kernel!r}; choose one of gated_delta_step, kda_step or a stage"
            f" of {', '.join(CHAINS)}'s chain (costmodel.CHAINS)"
        )
    if dtype not in _DTYPES:
        raise CostModelError(f"unknown dtype {dtype!r}; choose one of {', '.join(_DTYPES)}")
    keys = _SHAPE_KEYS[_family(kernel)]
    missing = [k for k in keys if k not in shape]
    if missing:
        raise CostModelError(f"{kernel} shape lacks {', '.join(missing)}")
    out = {k: int(shape[k]) for k in keys}
    bad = [k for k, v in out.items() if v < 1]
    if bad:
        raise CostModelError(f"{kernel} shape: {', '.join(bad)} must be >= 1")
    if "v_heads" in out and out["v_heads"] % out["k_heads"]:
        raise CostModelError(
            f"{kernel} shape: v_heads ({out['v_heads']}) must be a multiple of k_heads"
            f" ({out['k_heads']})"
        )
    return out


def _dims(shape: Mapping[str, int]) -> tuple[int, int, int, int, int]:
    """(batch, key heads, value heads, Dk, Dv) of either family's shape."""
    if "dim" in shape:
        return shape["batch"], shape["heads"], shape["heads"], shape["dim"], shape["dim"]
    return shape["batch"], shape["k_heads"], shape["v_heads"], shape["dk"], shape["dv"]


def state_bytes(shape: Mapping[str, int]) -> int:
    """Bytes of the fp32 recurrent state ``[B, Hv, Dk, Dv]`` of either family's shape."""
    b, _, hv, dk, dv = _dims(shape)
    return b * hv * dk * dv * 4


def io_bytes(kernel: str, shape: Mapping[str, int], dtype: str) -> int:
    """Bytes the fused step reads and writes besides the state (its small inputs, the
    parameters it reads and its output), for the bytes-moved floor."""
    b, hk, hv, dk, dv = _dims(shape)
    io = _DTYPES[dtype].itemsize
    if _family(kernel) == "gated_delta_step":
        # q, k; v, z, out; a, b (io) + neg_a, dt_bias, weight (fp32)
        return (2 * b * hk * dk + 3 * b * hv * dv + 2 * b * hv) * io + (2 * hv + dv) * 4
    # q, k, v, g_raw, gate, out; b (io) + neg_a, dt_bias [H, D], weight (fp32)
    return (6 * b * hv * dk + b * hv) * io + (hv + hv * dk + dk) * 4


def build_call(
    bk: Backend, kernel: str, shape: Mapping[str, int], dtype: str, tiles: Mapping[str, Any]
) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    """The :class:`Simulator` worker's builder (``tiles`` as a JSON dict)."""
    from . import kernels

    t = tiles_from_dict(tiles)
    dt = _DTYPES[dtype]
    b, hk, hv, dk, dv = _dims(shape)
    if kernel not in ("gated_delta_step", "kda_step"):
        return chain_stage(bk, kernel, shape, dt, t)
    state = torch.zeros(b * hv * dk, dv)
    if kernel == "gated_delta_step":
        fn = kernels.gated_delta_step_kernel(
            bk, b, hk, hv, dk, dv, dt, NORM_EPS, dt != torch.float32, t
        )
        return fn, (
            torch.zeros(b * hk, dk, dtype=dt),
            torch.zeros(b * hk, dk, dtype=dt),
            torch.zeros(b * hv, dv, dtype=dt),
            torch.zeros(b * hv, 1, dtype=dt),
            torch.zeros(b * hv, 1, dtype=dt),
            torch.zeros(b * hv, dv, dtype=dt),
            torch.zeros(hv, 1),
            torch.zeros(hv, 1),
            torch.zeros(1, dv),
            state,
            state,
            torch.empty(b * hv, dv, dtype=dt),
        )
    fn = kernels.kda_step_kernel(bk, b, hv, dk, dt, NORM_EPS, t)
    return fn, (
        torch.zeros(b * hv, dk, dtype=dt),
        torch.zeros(b * hv, dk, dtype=dt),
        torch.zeros(b * hv, dk, dtype=dt),
        torch.zeros(b * hv, dk, dtype=dt),
        torch.zeros(b * hv, 1, dtype=dt),
        torch.zeros(b * hv, dk, dtype=dt),
        torch.zeros(hv, 1),
        torch.zeros(hv, dk),
        torch.zeros(1, dk),
        state,
        state,
        torch.empty(b * hv, dk, dtype=dt),
    )


# --------------------------------------------------------------------------- the chain
#
# Layouts are eager's, flattened to 2-D: per-head scalars (a, b, g, beta) [B, Hv]; q, k
# [B*H, Dk] (a column per head when viewed [B*H*Dk, 1], as ``k.unsqueeze(-1)`` is);
# v, z and per-head outputs [B*H, Dv]; state-sized tensors [B*H*Dk, Dv] fp32. Every
# stage loops over (batch, head) as the fused step does: the state stages one head per
# task at the state tile, the per-head row stages ``row_group`` heads per task; the
# [B, Hv] scalar stages take a batch row per task, the repeats a key head per task.

#: Stages that are no launch in an fp32 model (``.float()`` / ``.to(io)`` of fp32).
_CASTS = ("cast_v", "cast_beta", "cast_out")
#: Stages over the state, one head's ``[Dk, Dv]`` block per task.
_STATE_STAGES = ("state_decay", "state_k", "kv_mem", "outer", "state_add", "state_q", "readout")
#: Stages over one batch row of per-head scalars, and the repeats (one key head per task).
_UNTILED = ("beta", "cast_beta", "repeat_q", "repeat_k")


def stage_tiling(kernel: str) -> str | None:
    """Which tile field a kernel's cycles depend on: ``"state"`` (``vec_rows`` x
    ``vec_cols``, the fused steps and the state stages), ``"rows"`` (heads per task, the
    per-head row stages) or None (the per-batch-row stages and the repeats)."""
    if kernel in ("gated_delta_step", "kda_step"):
        return "state"
    family, _, stage = kernel.partition(".")
    if stage in _STATE_STAGES:
        return "state"
    if stage in _UNTILED or (family == "gated_delta" and stage in ("gate", "decay_exp")):
        return None
    return "rows"


def chain(kernel: str, shape: Mapping[str, int], dtype: str) -> tuple[str, ...]:
    """The stage kernels eager launches for one step of ``kernel`` at ``shape``, in order.

    The fp32 casts and (at one value head per key head) the repeats are no launches
    in eager, so they are left out.
    """
    _, hk, hv, _, _ = _dims(check_shape(kernel, shape, dtype))
    out = []
    for name in CHAINS[kernel]:
        stage = name.partition(".")[2]
        if stage in _CASTS and dtype == "fp32":
            continue
        if stage.startswith("repeat_") and hv == hk:
            continue
        out.append(name)
    return tuple(out)


def _sigmoid(pypto: Any, x: Any) -> Any:
    # As kernels._sigmoid: pypto.sigmoid breaks on a partial tile.
    return pypto.div(
        pypto.add(pypto.mul(x, 0.0), 1.0), pypto.add(pypto.exp(pypto.mul(x, -1.0)), 1.0)
    )


def _stage_kernel(
    bk: Backend,
    name: str,
    loops: tuple[int, int],
    tile: tuple[int, int],
    shapes: tuple[tuple[tuple[int, int], torch.dtype], ...],
    body: Callable[..., None],
) -> Any:
    """One chain stage: ``for bi, h in loops: body(bi, h, *tensors)`` at vector ``tile``.

    ``shapes``: each parameter's (2-D shape, torch dtype), the output last. PyPTO's jit
    caches a closure's build by its code and the ``str`` of its frame's locals; every
    stage shares the code below, so ``key`` (name, loops, tile, shapes) tells them apart.
    """
    pypto = bk.pypto
    s = [pypto.Tensor(shape, bk.dtype(d)) for shape, d in shapes]
    key = repr((name, loops, tile, shapes))
    outer, inner = loops
    rows, cols = tile
    jit = pypto.frontend.jit(**bk.jit_options())
    if len(s) == 2:

        @jit
        def stage2(t0: s[0], t1: s[1]):
            for bi in pypto.loop(outer):
                for h in pypto.loop(inner):
                    pypto.set_vec_tile_shapes(rows, cols)
                    body(bi, h, t0, t1)

        fn: Any = stage2
    elif len(s) == 3:

        @jit
        def stage3(t0: s[0], t1: s[1], t2: s[2]):
            for bi in pypto.loop(outer):
                for h in pypto.loop(inner):
                    pypto.set_vec_tile_shapes(rows, cols)
                    body(bi, h, t0, t1, t2)

        fn = stage3
    elif len(s) == 4:

        @jit
        def stage4(t0: s[0], t1: s[1], t2: s[2], t3: s[3]):
            for bi in pypto.loop(outer):
                for h in pypto.loop(inner):
                    pypto.set_vec_tile_shapes(rows, cols)
                    body(bi, h, t0, t1, t2, t3)

        fn = stage4
    else:
        raise ValueError(f"{name}: no chain stage takes {len(s)} tensors ({key})")
    return fn


def row_group(heads: int, tiles: Tiles) -> int:
    """Heads per loop iteration of the chain's per-head row stages: the largest divisor
    of ``heads`` not above ``tiles.rows`` (1 = one head per task, as the fused step)."""
    return max(g for g in range(1, min(heads, max(1, tiles.rows)) + 1) if heads % g == 0)


def chain_stage(
    bk: Backend, kernel: str, shape: Mapping[str, int], dt: torch.dtype, tiles: Tiles = STEP_TILES
) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    """One stage of the unfused chain (a :data:`CHAINS` name) and its zero arguments.

    State stages take ``tiles``' state tile (:func:`.kernels.state_tiles`), one head per
    loop iteration; row stages take :func:`row_group` heads per iteration (``tiles.rows``).
    """
    pypto = bk.pypto
    f32 = pypto.DT_FP32
    io = bk.dtype(dt)
    fp = torch.float32
    b, hk, hv, dk, dv = _dims(shape)
    n, kda = b * hv, kernel.startswith("kda.")
    stage = kernel.partition(".")[2]
    srows, scols = state_tiles(dk, dv, tiles)
    g = row_group(hv, tiles)
    state = ((n * dk, dv), fp)
    col = ((n * dk, 1), fp)  # q, k (or KDA's per-channel decay) as a column per head
    row_io, row_f = ((n, dv), dt), ((n, dv), fp)
    krow_io, krow_f = ((n, dk), dt), ((n, dk), fp)
    scal_io, scal_f = ((b, hv), dt), ((b, hv), fp)
    heads, rows, per_batch, on_state = (b, hv), (b, hv // g), (b, 1), (srows, scols)

    def v(t: Any, i: Any, w: int, r: int = 1) -> Any:  # rows i .. i+r of a [., w] tensor
        return pypto.view(t, [r, w], [i, 0])

    def put(x: Any, i: Any, out: Any) -> None:
        pypto.assemble(x, [i, 0], out)

    def sblock(t: Any, i: Any) -> Any:  # head i's [Dk, Dv] block
        return pypto.view(t, [dk, dv], [i * dk, 0])

    def kcol(t: Any, i: Any) -> Any:  # head i's [Dk, 1] column
        return pypto.view(t, [dk, 1], [i * dk, 0])

    loops: tuple[int, int]
    tile: tuple[int, int]
    shapes: tuple[tuple[tuple[int, int], torch.dtype], ...]
    body: Callable[..., None]
    if stage == "beta":
        loops, tile, shapes = per_batch, (1, hv), (scal_io, scal_io)

        def body(bi: Any, h: Any, x: Any, out: Any) -> None:
            put(pypto.cast(_sigmoid(pypto, pypto.cast(v(x, bi, hv), f32)), io), bi, out)

    elif stage == "gate" and not kda:
        loops, tile = per_batch, (1, hv)
        shapes = (scal_io, ((1, hv), fp), ((1, hv), fp), scal_f)

        def body(bi: Any, h: Any, a: Any, bias: Any, neg_a: Any, out: Any) -> None:
            x = pypto.cast(v(a, bi, hv), f32) + v(bias, 0, hv)
            sp = pypto.where(pypto.gt(x, 20.0), x, pypto.log1p(pypto.exp(x)))
            put(v(neg_a, 0, hv) * sp, bi, out)

    elif stage == "gate":
        loops, tile = rows, (g, dk)
        shapes = (krow_io, ((hv, dk), fp), ((hv, 1), fp), krow_f)

        def body(bi: Any, h: Any, g_raw: Any, bias: Any, neg_a: Any, out: Any) -> None:
            i = bi * hv + h * g
            x = pypto.cast(v(g_raw, i, dk, g), f32) + v(bias, h * g, dk, g)
            sp = pypto.where(pypto.gt(x, 20.0), x, pypto.log(pypto.add(pypto.exp(x), 1.0)))
            put(v(neg_a, h * g, 1, g) * sp, i, out)

    elif stage == "decay_exp" and not kda:
        loops, tile, shapes = per_batch, (1, hv), (scal_f, scal_f)

        def body(bi: Any, h: Any, x: Any, out: Any) -> None:
            put(pypto.exp(v(x, bi, hv)), bi, out)

    elif stage == "decay_exp":
        loops, tile, shapes = rows, (g, dk), (krow_f, krow_f)

        def body(bi: Any, h: Any, x: Any, out: Any) -> None:
            put(pypto.exp(v(x, bi * hv + h * g, dk, g)), bi * hv + h * g, out)

    elif stage in ("repeat_q", "repeat_k"):
        # One key head per iteration, broadcast to its ``rep`` value heads' rows in one
        # block (one assemble per row took 3x as long at rep 3).
        rep = hv // hk
        loops, tile, shapes = (b, hk), (rep, dk), (((b * hk, dk), dt), krow_io)

        def body(bi: Any, h: Any, x: Any, out: Any) -> None:
            src = pypto.expand_clone(v(x, bi * hk + h, dk), [rep, dk])
            put(src, (bi * hk + h) * rep, out)

    elif stage in ("l2norm_q", "l2norm_k"):
        loops, tile, shapes = rows, (g, dk), (krow_io, krow_f)

        def body(bi: Any, h: Any, x: Any, out: Any) -> None:
            xf = pypto.cast(v(x, bi * hv + h * g, dk, g), f32)
            ss = pypto.sum(xf * xf, -1, True) + QK_EPS
            put(
                pypto.div(xf, pypto.sqrt(ss)) if kda else xf * pypto.rsqrt(ss), bi * hv + h * g, out
            )

    elif stage == "q_scale":
        loops, tile, shapes = rows, (g, dk), (krow_f, krow_f)

        def body(bi: Any, h: Any, x: Any, out: Any) -> None:
            xf = v(x, bi * hv + h * g, dk, g)
            put(xf * (1 / dk**0.5) if kda else pypto.div(xf, dk**0.5), bi * hv + h * g, out)

    elif stage == "cast_v":
        loops, tile, shapes = rows, (g, dv), (row_io, row_f)

        def body(bi: Any, h: Any, x: Any, out: Any) -> None:
            put(pypto.cast(v(x, bi * hv + h * g, dv, g), f32), bi * hv + h * g, out)

    elif stage == "cast_beta":
        loops, tile, shapes = per_batch, (1, hv), (scal_io, scal_f)

        def body(bi: Any, h: Any, x: Any, out: Any) -> None:
            put(pypto.cast(v(x, bi, hv), f32), bi, out)

    elif stage == "state_decay" and not kda:
        # ``S * g_t`` with g_t [B, H, 1, 1]: the per-head scalar broadcast to a [1, Dv] row
        # first (PyPTO broadcasts one axis per operand), under a row tile.
        loops, tile, shapes = heads, on_state, (state, ((n, 1), fp), state)

        def body(bi: Any, h: Any, x: Any, decay: Any, out: Any) -> None:
            i = bi * hv + h
            pypto.set_vec_tile_shapes(1, dv)
            d = pypto.expand_clone(pypto.view(decay, [1, 1], [i, 0]), [1, dv])
            pypto.set_vec_tile_shapes(srows, scols)
            put(sblock(x, i) * d, i * dk, out)

    elif stage in ("state_decay", "state_k", "state_q"):
        loops, tile, shapes = heads, on_state, (state, col, state)

        def body(bi: Any, h: Any, x: Any, c: Any, out: Any) -> None:
            i = bi * hv + h
            put(sblock(x, i) * kcol(c, i), i * dk, out)

    elif stage in ("kv_mem", "readout"):
        loops, tile, shapes = heads, on_state, (state, row_f)

        def body(bi: Any, h: Any, x: Any, out: Any) -> None:
            i = bi * hv + h
            put(pypto.sum(sblock(x, i), 0, True), i, out)

    elif stage == "delta":
        loops, tile, shapes = rows, (g, dv), (row_f, row_f, ((n, 1), fp), row_f)

        def body(bi: Any, h: Any, vf: Any, kv: Any, beta: Any, out: Any) -> None:
            i = bi * hv + h * g
            put((v(vf, i, dv, g) - v(kv, i, dv, g)) * v(beta, i, 1, g), i, out)

    elif stage == "outer":
        loops, tile, shapes = heads, on_state, (col, row_f, state)

        def body(bi: Any, h: Any, k: Any, delta: Any, out: Any) -> None:
            i = bi * hv + h
            put(kcol(k, i) * v(delta, i, dv), i * dk, out)

    elif stage == "state_add":
        loops, tile, shapes = heads, on_state, (state, state, state)

        def body(bi: Any, h: Any, x: Any, kd: Any, out: Any) -> None:
            i = bi * hv + h
            put(sblock(x, i) + sblock(kd, i), i * dk, out)

    elif stage == "store_out":
        loops, tile, shapes = rows, (g, dv), (row_f, row_f)

        def body(bi: Any, h: Any, o: Any, out: Any) -> None:
            put(v(o, bi * hv + h * g, dv, g), bi * hv + h * g, out)

    elif stage == "cast_out":
        loops, tile, shapes = rows, (g, dv), (row_f, row_io)

        def body(bi: Any, h: Any, o: Any, out: Any) -> None:
            put(pypto.cast(v(o, bi * hv + h * g, dv, g), io), bi * hv + h * g, out)

    elif stage == "rmsnorm":
        # Gated DeltaNet casts the normalised row back to io; KDA stays in fp32.
        loops, tile, shapes = rows, (g, dv), (row_io, row_f if kda else row_io)

        def body(bi: Any, h: Any, o: Any, out: Any) -> None:
            x = pypto.cast(v(o, bi * hv + h * g, dv, g), f32)
            x = x * pypto.rsqrt(pypto.div(pypto.sum(x * x, -1, True), float(dv)) + NORM_EPS)
            put(x if kda else pypto.cast(x, io), bi * hv + h * g, out)

    elif stage == "norm_weight":
        hdt = fp if kda else dt
        loops, tile = rows, (g, dv)
        shapes = (((n, dv), hdt), ((1, dv), hdt), ((n, dv), hdt))

        def body(bi: Any, h: Any, x: Any, w: Any, out: Any) -> None:
            y = pypto.cast(v(x, bi * hv + h * g, dv, g), f32) * pypto.cast(v(w, 0, dv), f32)
            put(y if kda else pypto.cast(y, io), bi * hv + h * g, out)

    elif stage in ("silu_gate", "sigmoid_gate"):
        loops, tile, shapes = rows, (g, dv), (row_f if kda else row_io, row_io, row_io)

        def body(bi: Any, h: Any, x: Any, z: Any, out: Any) -> None:
            i = bi * hv + h * g
            zf = pypto.cast(v(z, i, dv, g), f32)
            gz = _sigmoid(pypto, zf) if kda else zf * _sigmoid(pypto, zf)
            put(pypto.cast(pypto.cast(v(x, i, dv, g), f32) * gz, io), i, out)

    else:
        raise CostModelError(f"unknown chain stage {kernel!r}")
    fn = _stage_kernel(bk, kernel, loops, tile, shapes, body)
    args = [torch.zeros(*shp, dtype=d) for shp, d in shapes[:-1]]
    args.append(torch.empty(*shapes[-1][0], dtype=shapes[-1][1]))
    return fn, tuple(args)


BUILDER = f"{__name__}:build_call"


class LinearAttentionSimulator(Simulator):
    """pypto-kernels-common's worker-process simulator, building this package's kernels."""

    def __init__(self, timeout_s: float = 600.0) -> None:
        super().__init__(BUILDER, timeout_s=timeout_s, install_hint=INSTALL_HINT)
