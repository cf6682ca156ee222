"""What every PyPTO kernels package shares, so none of them carries a copy.

The CPU SIM+verify shim (:mod:`.sim`), the backend choice (:func:`backend`), the
dispatch rule "envelope check, then the kernel or a counted fallback logged once"
(:class:`KernelPackage`, :class:`Envelope`, :class:`KernelError`), the per-package
switch and stats registries, the one precision-case schema (:mod:`.precision`), the
cost-model measurement (:mod:`.costmodel`) and the declared PyPTO NPU names
(:mod:`.npu`). :mod:`.precision_child` runs a suite's cases in a child process (not
imported here: it is also run with ``python -m``). See the README for building a new kernels package on it, step by step.
"""

from __future__ import annotations

from . import costmodel, npu, precision, sim
from .backend import CPU_SIM_ENV, Backend, backend, cost_backend, npu_available
from .costmodel import CostResult, Simulator, measure
from .dispatch import Envelope, KernelError, KernelPackage, PackCache, compiling
from .npu import NPU_API, NPU_API_TABLE
from .precision import Case, PrecisionSuite
from .registry import StatsRegistry, SwitchError, SwitchRegistry
from .sim import SUPPORTED_VERSION, SimUnavailableError
from .tiles import CostModelError, Tiles, TilesError, tiles_from_dict, tiles_to_dict

__version__ = "0.1.0"

__all__ = [
    "CPU_SIM_ENV",
    "NPU_API",
    "NPU_API_TABLE",
    "SUPPORTED_VERSION",
    "Backend",
    "Case",
    "CostModelError",
    "CostResult",
    "Envelope",
    "KernelError",
    "KernelPackage",
    "PackCache",
    "PrecisionSuite",
    "SimUnavailableError",
    "Simulator",
    "StatsRegistry",
    "SwitchError",
    "SwitchRegistry",
    "Tiles",
    "TilesError",
    "backend",
    "compiling",
    "cost_backend",
    "costmodel",
    "measure",
    "npu",
    "npu_available",
    "precision",
    "sim",
    "tiles_from_dict",
    "tiles_to_dict",
]
