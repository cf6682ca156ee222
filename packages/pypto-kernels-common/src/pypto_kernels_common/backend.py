"""How PyPTO runs for a tensor's device: the CPU SIM shim, the real NPU, or the cost model.

A kernel factory only needs ``bk.pypto`` (the module), ``bk.jit_options()`` (the
``@pypto.frontend.jit`` keywords for this mode) and ``bk.dtype(torch_dtype)``, so the
same factory builds for every mode. Nothing here imports pypto at module import.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import torch

from . import npu, sim
from .sim import SimUnavailableError

__all__ = [
    "CPU_SIM_ENV",
    "MODES",
    "Backend",
    "backend",
    "cost_backend",
    "cpu_sim_disabled",
    "npu_available",
]

#: ``=0`` turns the CPU SIM path off for every kernels package (their calls fall back).
CPU_SIM_ENV = "PYPTO_KERNELS_CPU_SIM"
MODES = ("sim", "npu", "cost")

_DTYPES = {torch.bfloat16: "DT_BF16", torch.float16: "DT_FP16", torch.float32: "DT_FP32"}


class Backend:
    """``sim`` (CPU SIM + verify shim), ``npu`` (real hardware) or ``cost`` (cost model only).

    Hashable by identity, so kernel factories can be ``lru_cache``-d on it.
    """

    def __init__(self, pypto: ModuleType, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown backend mode {mode!r}; choose from {', '.join(MODES)}")
        self.pypto = pypto
        self.mode = mode

    def __repr__(self) -> str:
        return f"Backend({self.mode!r})"

    def jit_options(self) -> dict[str, Any]:
        if self.mode == "sim":
            return sim.sim_options(self.pypto)
        if self.mode == "cost":
            return sim.cost_options(self.pypto)
        run = npu.options(
            "pypto.frontend.jit", "runtime_options", run_mode=npu.api("pypto.RunMode.NPU")
        )
        return npu.kwargs("pypto.frontend.jit", runtime_options=run)

    def dtype(self, torch_dtype: torch.dtype) -> Any:
        if torch_dtype not in _DTYPES:
            raise TypeError(f"PyPTO kernels take {[str(d) for d in _DTYPES]}, not {torch_dtype}")
        if self.mode == "npu":
            return npu.api(f"pypto.{_DTYPES[torch_dtype]}")
        return getattr(self.pypto, _DTYPES[torch_dtype])


def npu_available() -> bool:
    """True when torch_npu is importable and reports a device (CANN installed)."""
    if not os.environ.get("ASCEND_HOME_PATH") and not os.environ.get("ASCEND_TOOLKIT_HOME"):
        return False
    try:
        is_available = npu.api("torch_npu.npu.is_available")
    except (ImportError, AttributeError):
        return False
    return bool(is_available())


def cpu_sim_disabled(extra_env: Iterable[str] = ()) -> str | None:
    """The variable that turned the CPU SIM path off (``=0``), if any."""
    for var in (CPU_SIM_ENV, *extra_env):
        if os.environ.get(var, "1") == "0":
            return var
    return None


def backend(
    device_type: str, *, install_hint: str = sim.INSTALL_HINT, cpu_sim_env: Iterable[str] = ()
) -> Backend:
    """The PyPTO backend for tensors on ``device_type``; raises SimUnavailableError.

    ``cpu_sim_env`` names a package's own off switch besides ``$PYPTO_KERNELS_CPU_SIM``.
    """
    if device_type == "cpu":
        var = cpu_sim_disabled(cpu_sim_env)
        if var is not None:
            raise SimUnavailableError(f"CPU SIM path disabled by {var}=0")
    return _backend(device_type, install_hint)


@functools.lru_cache(maxsize=4)
def _backend(device_type: str, install_hint: str) -> Backend:
    if device_type == "npu":
        return Backend(sim.import_pypto(install_hint), "npu")
    if device_type != "cpu":
        raise SimUnavailableError(f"PyPTO has no backend for {device_type} tensors")
    return Backend(sim.install(install_hint), "sim")


_COST: Backend | None = None


def cost_backend(install_hint: str = sim.INSTALL_HINT) -> Backend:
    """The cost-model-only backend (no precision tool, so no cmake: only g++)."""
    global _COST
    if _COST is None:
        sim.check_compiler()
        _COST = Backend(sim.import_pypto(install_hint), "cost")
    return _COST
