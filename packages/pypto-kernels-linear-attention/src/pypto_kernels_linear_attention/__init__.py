"""PyPTO decode-step kernels for Gated DeltaNet and KDA layers, behind switches.

One kernel per layer type fuses the recurrent decode step (gate and decay, l2norm,
delta-rule state update in place, read-out, gated RMSNorm) that transformers runs as a
chain of small per-head operators. ``PACKAGE.switches.pto_switches(gated_delta_step=True)``,
``$PYPTO_LINEAR_ATTENTION_SWITCHES`` and the module attributes ``USE_PTO_GATED_DELTA_STEP``
/ ``USE_PTO_KDA_STEP`` set the switches. The CPU SIM shim, the dispatch rule, the
registries, the precision schema and the cost-model machinery are pypto-kernels-common's.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .ops import GATED_DELTA_ENVELOPE, KDA_ENVELOPE, KernelError, gated_delta_step, kda_step
from .package import PACKAGE
from .plugin import PLUGIN, fitting_layers
from .reference import gated_delta_step_reference, kda_step_reference

__version__ = "0.1.0"

__all__ = [
    "GATED_DELTA_ENVELOPE",
    "KDA_ENVELOPE",
    "PACKAGE",
    "PLUGIN",
    "KernelError",
    "fitting_layers",
    "gated_delta_step",
    "gated_delta_step_reference",
    "kda_step",
    "kda_step_reference",
    "report",
]


def report() -> dict[str, Any]:
    """Switches, call counts by backend, and the last fallback reason per op."""
    return PACKAGE.report()


class _Module(types.ModuleType):
    USE_PTO_GATED_DELTA_STEP = property(
        lambda _m: PACKAGE.switches.is_on("gated_delta_step"),
        lambda _m, v: PACKAGE.switches.set_switch("gated_delta_step", v),
    )
    USE_PTO_KDA_STEP = property(
        lambda _m: PACKAGE.switches.is_on("kda_step"),
        lambda _m, v: PACKAGE.switches.set_switch("kda_step", v),
    )


sys.modules[__name__].__class__ = _Module
