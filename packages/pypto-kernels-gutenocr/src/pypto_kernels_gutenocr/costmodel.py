"""GutenOCR's kernels in the PyPTO cost model: shapes, candidate tilings, the plug-in face.

How a call is simulated and its cycles read (``measure``, the ``Simulator`` worker that
survives a tiling that breaks pypto 0.2.0's process state, the 910B buffer limits) is
pypto-kernels-common's :mod:`pypto_kernels_common.costmodel`; this module adds what is
GutenOCR's own: which kernels are tunable (``rms_norm``, ``swiglu_mlp``), their shape
names and envelopes, their default tiles, the candidate tilings worth simulating, and
how the worker builds one call (:func:`build_call`). ``Total Cycles / 1800`` is the
simulated time in us: a relative signal at fixed shapes, not a validated NPU time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from pypto_kernels_common import cost_backend as _cost_backend
from pypto_kernels_common import costmodel as _cm
from pypto_kernels_common import sim
from pypto_kernels_common.costmodel import (
    CUBE_ALIGN,
    CYCLES_PER_US,
    L0A_BYTES,
    L0B_BYTES,
    L0C_BYTES,
    L1_BYTES,
    UB_BYTES,
    UB_LIVE_TILES,
    CostModelError,
    CostResult,
    cube_fits,
    measure,
    next_pow2,
    pow2_upto,
    read_cycles,
    to_us,
    ub_fits,
)
from pypto_kernels_common.tiles import tiles_from_dict as _tiles_from_dict
from pypto_kernels_common.tiles import tiles_to_dict

from .kernels import Backend, Tiles, rms_tiles, swiglu_tiles
from .ops import ENVELOPES
from .package import INSTALL_HINT

__all__ = [
    "CUBE_ALIGN",
    "CYCLES_PER_US",
    "DTYPES",
    "INSTALL_HINT",
    "L0A_BYTES",
    "L0B_BYTES",
    "L0C_BYTES",
    "L1_BYTES",
    "MAX_ROWS",
    "SHAPE_NAMES",
    "TUNABLES",
    "UB_BYTES",
    "UB_LIVE_TILES",
    "CostModelError",
    "CostResult",
    "Simulator",
    "TunableKernel",
    "availability",
    "build_call",
    "candidate_tiles",
    "check_compiler",
    "check_shape",
    "cost_backend",
    "cube_fits",
    "default_tiles",
    "measure",
    "read_cycles",
    "simulate",
    "tiles_from_dict",
    "tiles_label",
    "tiles_to_dict",
    "to_us",
    "ub_fits",
]

#: Rows beyond this are refused by the search (cost and memory grow with rows, the
#: ranking of tilings does not change past a few loop steps).
MAX_ROWS = 65_536

check_compiler = sim.check_compiler
_RMS_EPS = 1e-6

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}

SHAPE_NAMES: dict[str, tuple[str, ...]] = {
    "rms_norm": ("rows", "hidden"),
    "swiglu_mlp": ("rows", "hidden", "inter"),
}

# --------------------------------------------------------------------------- tiles


def tiles_from_dict(data: Mapping[str, Any]) -> Tiles:
    """The inverse of ``tiles_to_dict``; unknown keys are refused (CostModelError)."""
    tiles: Tiles = _tiles_from_dict(data, Tiles)
    return tiles


def tiles_label(tiles: Tiles, kernel: str = "swiglu_mlp") -> str:
    """A compact one-line label for tables (RMSNorm has no cube tiles)."""
    vec = f"rows={tiles.rows} vec={tiles.vec_rows}x{tiles.vec_cols}"
    if kernel == "rms_norm":
        return vec
    return (
        f"{vec} m={tiles.cube_m[0]}/{tiles.cube_m[1]} k={tiles.cube_k[0]}/{tiles.cube_k[1]}"
        f" n={tiles.cube_n[0]}/{tiles.cube_n[1]}"
    )


def _torch_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise CostModelError(f"dtype {dtype!r} is not supported; use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def _check_kernel(kernel: str) -> None:
    if kernel not in SHAPE_NAMES:
        raise CostModelError(
            f"kernel {kernel!r} has no tile search; tunable kernels: {sorted(SHAPE_NAMES)}"
        )


def check_shape(kernel: str, shape: Mapping[str, int], dtype: str = "bf16") -> dict[str, int]:
    """The shape as a plain dict, or CostModelError saying what is wrong and what fits.

    The envelope is the kernel's own (:data:`.ops.ENVELOPES`), so the search accepts
    exactly the shapes the model's calls would run through PyPTO.
    """
    _check_kernel(kernel)
    tdt = _torch_dtype(dtype)
    names = SHAPE_NAMES[kernel]
    missing = [n for n in names if n not in shape]
    extra = sorted(set(shape) - set(names))
    if missing or extra:
        want = ",".join(f"{n}=N" for n in names)
        raise CostModelError(
            f"{kernel} shape needs exactly {', '.join(names)}"
            f" (missing {missing}, unknown {extra}); pass --shape {want}"
        )
    out: dict[str, int] = {}
    for n in names:
        v = shape[n]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise CostModelError(f"{kernel} shape {n}={v!r} must be a positive integer")
        out[n] = v
    if out["rows"] > MAX_ROWS:
        raise CostModelError(
            f"{kernel} rows={out['rows']} is above the search's limit {MAX_ROWS}; use fewer rows"
        )
    env = ENVELOPES[kernel]
    if tdt not in env.dtypes:
        raise CostModelError(f"{kernel} does not take dtype {dtype}")

    def meta(*size: int) -> torch.Tensor:  # shapes only: nothing is allocated
        return torch.empty(size, device="meta", dtype=tdt)

    if kernel == "rms_norm":
        tensors = [meta(out["rows"], out["hidden"]), meta(out["hidden"])]
    else:
        h, i = out["hidden"], out["inter"]
        tensors = [meta(out["rows"], h), meta(h, i), meta(h, i), meta(i, h)]
    for rule in env.rules:
        reason = rule(*tensors)
        if reason:
            raise CostModelError(f"{kernel} shape outside the kernel's envelope: {reason}")
    return out


def default_tiles(kernel: str, dtype: str = "bf16") -> Tiles:
    """The tiles the model's calls use today (``kernels.rms_tiles`` / ``swiglu_tiles``)."""
    _check_kernel(kernel)
    tdt = _torch_dtype(dtype)
    return rms_tiles(tdt) if kernel == "rms_norm" else swiglu_tiles(tdt)


def _cols(options: list[int], dim: int, default_cols: int) -> list[int]:
    """Vector-column choices for a dimension, spelled like the default where equivalent.

    The kernels tile ``min(dim, vec_cols)`` columns, so 2048 and 512 are the same tiling
    of a 512-wide row; using the default's spelling keeps the default a neighbour of
    every other candidate in the search.
    """
    out: list[int] = []
    for c in options:
        v = default_cols if min(c, dim) == min(default_cols, dim) else c
        if v not in out:
            out.append(v)
    return out


def candidate_tiles(kernel: str, shape: Mapping[str, int], dtype: str = "bf16") -> list[Tiles]:
    """Every tiling worth simulating for this shape, the default first.

    Respects the buffer limits (UB for vector tiles, L0A/L0B/L0C/L1 for cube tiles,
    in bytes of ``dtype``) and the shape (no tile wider than the dimension it
    tiles, vector rows dividing the loop step). The default is always included, even
    where these rules would drop it, so a search can report against it.
    """
    s = check_shape(kernel, shape, dtype)
    elem = torch.empty((), dtype=_torch_dtype(dtype)).element_size()
    default = default_tiles(kernel, dtype)
    cands: list[Tiles] = [default]
    seen = {default}

    def add(t: Tiles) -> None:
        if t not in seen:
            seen.add(t)
            cands.append(t)

    row_cap = max(8, next_pow2(s["rows"]))
    if kernel == "rms_norm":
        h = s["hidden"]
        cols = _cols(
            sorted({c for c in (h, h // 2, h // 4) if c >= 64 and c % 64 == 0 and h % c == 0}),
            h,
            default.vec_cols,
        )
        for rows in sorted({*pow2_upto(1, min(64, row_cap)), default.rows}):
            for vr in sorted(
                {*pow2_upto(1, rows), *([default.vec_rows] if default.vec_rows <= rows else [])}
            ):
                for vc in cols:
                    if ub_fits(vr, min(vc, h)):
                        add(Tiles(rows=rows, vec_rows=vr, vec_cols=vc))
        return cands

    h, i = s["hidden"], s["inter"]
    cap = max(min(h, i), 64)  # no cube k/n tile wider than both matmuls' k and n
    vcols = _cols(
        sorted({c for c in (512, 1024, 2048, 4096) if c <= i} or {i}), i, default.vec_cols
    )
    # Each axis also offers the default's own value, so the default has neighbours on
    # every axis (coordinate descent starts there).
    k_opts = [(k0, k1) for k0 in (64, 128, 256) for k1 in (k0, 2 * k0, 4 * k0) if k1 <= cap]
    k_opts += [default.cube_k] if default.cube_k not in k_opts else []
    n_opts = sorted({n for n in (64, 128, 256, 512) if n <= cap} | {default.cube_n[0]})
    for rows in sorted({*pow2_upto(16, min(128, max(16, row_cap))), default.rows}):
        m_opts = sorted({*pow2_upto(CUBE_ALIGN, 128), default.cube_m[0]})
        vr_opts = sorted({*pow2_upto(4, 32), default.vec_rows})
        for m in (m for m in m_opts if m <= rows):
            for k0, k1 in k_opts:
                for n in n_opts:
                    if not cube_fits(m, k0, k1, n, elem):
                        continue
                    for vr in (v for v in vr_opts if v <= rows and rows % v == 0):
                        for vc in vcols:
                            if ub_fits(vr, min(vc, i)):
                                add(
                                    Tiles(
                                        rows=rows,
                                        vec_rows=vr,
                                        vec_cols=vc,
                                        cube_m=(m, m),
                                        cube_k=(k0, k1),
                                        cube_n=(n, n),
                                    )
                                )
    return cands


# --------------------------------------------------------------------------- one call


def cost_backend() -> Backend:
    """The cost-model-only backend for ``kernels.*_kernel`` factories (in-process calls
    known to compile: the benchmark tool); searches go through :class:`Simulator`."""
    return _cost_backend(INSTALL_HINT)


def _build_call(
    bk: Backend, kernel: str, shape: Mapping[str, int], dtype: str, tiles: Tiles
) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    """The kernel built for these tiles and zero inputs (cycles do not depend on data)."""
    from . import kernels

    tdt = DTYPES[dtype]
    n, h = shape["rows"], shape["hidden"]
    x = torch.zeros(n, h, dtype=tdt)
    # __wrapped__: a search builds each tiling once; do not evict the model's cached kernels.
    if kernel == "rms_norm":
        fn = kernels.rms_norm_kernel.__wrapped__(bk, h, tdt, _RMS_EPS, tiles)
        return fn, (x, torch.ones(h, dtype=tdt), torch.empty_like(x))
    i = shape["inter"]
    fn = kernels.swiglu_mlp_kernel.__wrapped__(bk, h, i, tdt, tiles)
    w = torch.zeros(h, i, dtype=tdt)
    return fn, (x, w, w, torch.zeros(i, h, dtype=tdt), torch.empty_like(x))


def build_call(
    bk: Backend, kernel: str, shape: Mapping[str, int], dtype: str, tiles: Mapping[str, Any]
) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    """The :class:`Simulator` worker's builder (``tiles`` as a JSON dict)."""
    return _build_call(bk, kernel, shape, dtype, tiles_from_dict(tiles))


BUILDER = f"{__name__}:build_call"


class Simulator(_cm.Simulator):
    """pypto-kernels-common's worker-process simulator, building GutenOCR's kernels.

    Use as a context manager; ``timeout_s`` bounds one candidate. Requests are checked
    against the kernel's envelope before they reach the worker.
    """

    def __init__(self, timeout_s: float = 600.0) -> None:
        super().__init__(BUILDER, timeout_s=timeout_s, install_hint=INSTALL_HINT)

    def simulate(self, kernel: str, shape: Mapping[str, int], dtype: str, tiles: Any) -> CostResult:
        """One tiling's simulated time; failures come back as ``ok=False`` with a reason.

        Raises CostModelError for a bad request and SimUnavailableError when PyPTO
        cannot run here at all.
        """
        return super().simulate(kernel, check_shape(kernel, shape, dtype), dtype, tiles)


def availability() -> str | None:
    """None when the cost model can run here, else one line saying why and the fix."""
    return sim.availability(INSTALL_HINT)


def simulate(
    kernel: str,
    shape: Mapping[str, int],
    dtype: str = "bf16",
    tiles: Tiles | None = None,
    timeout_s: float = 600.0,
) -> CostResult:
    """Simulate one tiling (the default when ``tiles`` is None) in a one-off worker."""
    check_shape(kernel, shape, dtype)
    reason = availability()
    if reason:
        raise sim.SimUnavailableError(reason)
    with Simulator(timeout_s=timeout_s) as runner:
        return runner.simulate(kernel, shape, dtype, tiles or default_tiles(kernel, dtype))


# --------------------------------------------------------------------------- plug-in face


class TunableKernel:
    """What the plug-in's ``tunables()`` hands pypto-tune for one kernel.

    pypto-tune only sees this duck type: ``name``, ``shape_names``, ``dtypes``,
    ``availability()``, ``check_shape``, ``default_tiles``, ``candidate_tiles``,
    ``simulate`` and ``session()`` (a :class:`Simulator` for many candidates), plus
    ``tiles_to_dict`` / ``tiles_label`` for reports.
    """

    dtypes = tuple(DTYPES)
    install_hint = INSTALL_HINT

    def __init__(self, name: str) -> None:
        _check_kernel(name)
        self.name = name
        self.shape_names = SHAPE_NAMES[name]

    def __repr__(self) -> str:
        return f"TunableKernel({self.name!r})"

    def availability(self) -> str | None:
        return availability()

    def check_shape(self, shape: Mapping[str, int], dtype: str = "bf16") -> dict[str, int]:
        return check_shape(self.name, shape, dtype)

    def default_tiles(self, dtype: str = "bf16") -> Tiles:
        return default_tiles(self.name, dtype)

    def candidate_tiles(self, shape: Mapping[str, int], dtype: str = "bf16") -> list[Tiles]:
        return candidate_tiles(self.name, shape, dtype)

    def simulate(
        self, shape: Mapping[str, int], dtype: str = "bf16", tiles: Tiles | None = None
    ) -> CostResult:
        return simulate(self.name, shape, dtype, tiles)

    def session(self, timeout_s: float = 600.0) -> Simulator:
        return Simulator(timeout_s=timeout_s)

    @staticmethod
    def tiles_to_dict(tiles: Tiles) -> dict[str, Any]:
        return tiles_to_dict(tiles)

    def tiles_label(self, tiles: Tiles) -> str:
        return tiles_label(tiles, self.name)


TUNABLES: dict[str, TunableKernel] = {name: TunableKernel(name) for name in SHAPE_NAMES}
