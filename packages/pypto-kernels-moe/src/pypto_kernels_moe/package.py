"""This package's one op as a :class:`pypto_kernels_common.KernelPackage`.

Switches, call counts and the dispatch rule live in pypto-kernels-common; this module
only names the op, its flag and the variables that set it.
"""

from __future__ import annotations

from pypto_kernels_common import KernelPackage

__all__ = ["CPU_SIM_ENV", "ENV_VAR", "FLAG_NAMES", "INSTALL_HINT", "OPS", "PACKAGE"]

OPS = ("grouped_gemm",)
FLAG_NAMES = {"grouped_gemm": "USE_PTO_GROUPED_GEMM"}
#: A comma list of op names, or all / none; read at import.
ENV_VAR = "PYPTO_MOE_SWITCHES"
#: ``=0`` sends every CPU call to the reference (as ``$PYPTO_KERNELS_CPU_SIM=0`` does).
CPU_SIM_ENV = "PYPTO_MOE_CPU_SIM"
INSTALL_HINT = "pip install 'pypto-kernels-moe[pypto]'"

PACKAGE = KernelPackage(
    "pypto_kernels_moe",
    OPS,
    switches_env=ENV_VAR,
    flag_names=FLAG_NAMES,
    cpu_sim_env=(CPU_SIM_ENV,),
    install_hint=INSTALL_HINT,
)
