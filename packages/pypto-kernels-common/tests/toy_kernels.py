"""A tiny package built on pypto-kernels-common, as the README describes: one op, ``add``.

Used by the tests (and importable by the Simulator's worker through PYTHONPATH). No
``from __future__ import annotations`` here: the jit evaluates each parameter's
annotation (a ``pypto.Tensor(...)`` call), so they must not become strings.
"""

from typing import Any

import torch

from pypto_kernels_common import Backend, Envelope, KernelPackage, tiles_from_dict

PACKAGE = KernelPackage(
    "toy_kernels",
    ("add",),
    switches_env="TOY_KERNELS_SWITCHES",
    cpu_sim_env=("TOY_KERNELS_CPU_SIM",),
    install_hint="pip install 'toy-kernels[pypto]'",
)


def _width(a: torch.Tensor, b: torch.Tensor) -> str | None:
    if a.dim() != 2 or a.shape != b.shape:
        return f"a {tuple(a.shape)} and b {tuple(b.shape)} must be the same [N, W]"
    if a.shape[1] % 64:
        return f"width {a.shape[1]} outside envelope (multiple of 64)"
    return None


ADD_ENVELOPE = Envelope("add", rules=(_width,))


def add_kernel(bk: Backend, rows: int, cols: int, dtype: torch.dtype, vec_rows: int = 8) -> Any:
    pypto = bk.pypto
    dt = bk.dtype(dtype)

    @pypto.frontend.jit(**bk.jit_options())
    def add(
        a: pypto.Tensor((rows, cols), dt),
        b: pypto.Tensor((rows, cols), dt),
        out: pypto.Tensor((rows, cols), dt),
    ):
        pypto.set_vec_tile_shapes(vec_rows, cols)
        out[:] = pypto.add(a, b)

    return add


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    def kernel(bk: Backend) -> torch.Tensor:
        out = torch.empty_like(a)
        add_kernel(bk, a.shape[0], a.shape[1], a.dtype)(a.contiguous(), b.contiguous(), out)
        return out

    return PACKAGE.dispatch(
        "add", a.device.type, kernel, lambda: a + b, check=lambda: ADD_ENVELOPE.violation([a, b])
    )


def build(bk: Backend, kernel: str, shape: dict, dtype: str, tiles: dict) -> Any:
    """The Simulator worker's builder: zero inputs (cycles do not depend on data)."""
    t = tiles_from_dict(tiles)
    rows, cols = shape["rows"], shape["cols"]
    x = torch.zeros(rows, cols)
    return add_kernel(bk, rows, cols, torch.float32, t.vec_rows), (x, x, torch.empty_like(x))
