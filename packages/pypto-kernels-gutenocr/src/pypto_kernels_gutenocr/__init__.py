"""PyPTO fused kernels for GutenOCR's text decoder, with switches and torch fallbacks.

``pypto_kernels_gutenocr.USE_PTO_RMS_NORM`` (and ``USE_PTO_MROPE``,
``USE_PTO_SWIGLU_MLP``) read and write the switches in :mod:`.switches`, so
assigning the module attribute, :func:`pto_switches` and
``$PYPTO_GUTENOCR_SWITCHES`` all act on the same state. The CPU SIM shim, the
dispatch rule, the registries, the precision schema and the cost-model machinery are
pypto-kernels-common's; this package holds the GutenOCR kernels, envelopes and cases.
"""

from __future__ import annotations

import sys
import types

from . import costmodel, sim_shim, stats, switches
from .costmodel import CostModelError, CostResult, TunableKernel
from .kernels import Tiles
from .ops import (
    ENVELOPES,
    PACKED,
    Envelope,
    KernelError,
    mrope_pto_correct,
    rms_norm_wrapper,
    swiglu_mlp_wrapper,
)
from .policy import Decision, DynamicPTOConfig, PolicyError
from .reference import mrope_reference, mrope_select, rms_norm_reference, swiglu_mlp_reference
from .switches import pto_switches

__version__ = "0.1.0"

__all__ = [
    "ENVELOPES",
    "PACKED",
    "CostModelError",
    "CostResult",
    "Decision",
    "DynamicPTOConfig",
    "Envelope",
    "KernelError",
    "PolicyError",
    "Tiles",
    "TunableKernel",
    "costmodel",
    "mrope_pto_correct",
    "mrope_reference",
    "mrope_select",
    "pto_switches",
    "report",
    "rms_norm_reference",
    "rms_norm_wrapper",
    "sim_shim",
    "swiglu_mlp_reference",
    "swiglu_mlp_wrapper",
]


def report() -> dict:
    """Switches, per-op call counts by backend, and the last fallback reason per op."""
    return stats.report()


def _flag(op: str) -> property:
    return property(lambda _m: switches.is_on(op), lambda _m, v: switches.set_switch(op, v))


class _Module(types.ModuleType):
    USE_PTO_RMS_NORM = _flag("rms_norm")
    USE_PTO_MROPE = _flag("mrope")
    USE_PTO_SWIGLU_MLP = _flag("swiglu_mlp")


sys.modules[__name__].__class__ = _Module
