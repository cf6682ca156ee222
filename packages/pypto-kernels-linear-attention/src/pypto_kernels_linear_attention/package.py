"""This package's two ops as a :class:`pypto_kernels_common.KernelPackage`.

Switches, call counts and the dispatch rule live in pypto-kernels-common; this module
only names the ops, their flags and the variables that set them.
"""

from __future__ import annotations

from pypto_kernels_common import KernelPackage

__all__ = ["CPU_SIM_ENV", "ENV_VAR", "FLAG_NAMES", "INSTALL_HINT", "OPS", "PACKAGE"]

OPS = ("gated_delta_step", "kda_step")
FLAG_NAMES = {"gated_delta_step": "USE_PTO_GATED_DELTA_STEP", "kda_step": "USE_PTO_KDA_STEP"}
#: A comma list of op names, or all / none; read at import.
ENV_VAR = "PYPTO_LINEAR_ATTENTION_SWITCHES"
#: ``=0`` sends every CPU call to the reference (as ``$PYPTO_KERNELS_CPU_SIM=0`` does).
CPU_SIM_ENV = "PYPTO_LINEAR_ATTENTION_CPU_SIM"
INSTALL_HINT = "pip install 'pypto-kernels-linear-attention[pypto]'"

PACKAGE = KernelPackage(
    "pypto_kernels_linear_attention",
    OPS,
    switches_env=ENV_VAR,
    flag_names=FLAG_NAMES,
    cpu_sim_env=(CPU_SIM_ENV,),
    install_hint=INSTALL_HINT,
)
