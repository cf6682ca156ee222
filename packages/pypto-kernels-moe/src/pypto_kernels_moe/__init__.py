"""PyPTO grouped-GEMM MoE experts, behind a switch, with a torch reference.

``pypto_kernels_moe.USE_PTO_GROUPED_GEMM`` reads and writes the switch, as do
``PACKAGE.switches.pto_switches(grouped_gemm=True)`` and ``$PYPTO_MOE_SWITCHES``. The
CPU SIM shim, the dispatch rule, the registries, the precision schema and the
cost-model machinery are pypto-kernels-common's.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .ops import ENVELOPE, KernelError, grouped_gemm
from .package import PACKAGE
from .plugin import PLUGIN, activation_of, fitting_experts
from .reference import ACTIVATION_NAMES, activate, ascending_slots, grouped_gemm_reference

__version__ = "0.1.0"

__all__ = [
    "ACTIVATION_NAMES",
    "ENVELOPE",
    "PACKAGE",
    "PLUGIN",
    "KernelError",
    "activate",
    "activation_of",
    "ascending_slots",
    "fitting_experts",
    "grouped_gemm",
    "grouped_gemm_reference",
    "report",
]


def report() -> dict[str, Any]:
    """Switch, call counts by backend, and the last fallback reason."""
    return PACKAGE.report()


class _Module(types.ModuleType):
    USE_PTO_GROUPED_GEMM = property(
        lambda _m: PACKAGE.switches.is_on("grouped_gemm"),
        lambda _m, v: PACKAGE.switches.set_switch("grouped_gemm", v),
    )


sys.modules[__name__].__class__ = _Module
