"""The one ``KernelPackage`` of this package: its ops, switches and call counters."""

from __future__ import annotations

from pypto_kernels_common import KernelPackage

__all__ = ["OPS", "PACKAGE"]

OPS = ("gqa_decode", "softmax")

PACKAGE = KernelPackage(
    "pypto_kernels_attention",
    OPS,
    switches_env="PYPTO_ATTENTION_SWITCHES",
    cpu_sim_env=("PYPTO_ATTENTION_CPU_SIM",),
    install_hint="pip install 'pypto-kernels-attention[pypto]'",
)
