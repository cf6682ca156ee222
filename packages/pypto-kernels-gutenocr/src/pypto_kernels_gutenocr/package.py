"""This package's ops as one :class:`pypto_kernels_common.KernelPackage`.

Switches, call counts and the dispatch rule live in pypto-kernels-common; this module
only names the ops, their flags and the variables that set them.
"""

from __future__ import annotations

from pypto_kernels_common import KernelPackage

__all__ = ["CPU_SIM_ENV", "ENV_VAR", "FLAG_NAMES", "INSTALL_HINT", "OPS", "PACKAGE"]

OPS = ("rms_norm", "mrope", "swiglu_mlp")
FLAG_NAMES = {
    "rms_norm": "USE_PTO_RMS_NORM",
    "mrope": "USE_PTO_MROPE",
    "swiglu_mlp": "USE_PTO_SWIGLU_MLP",
}
#: A comma list of op names, or all / none; read at import.
ENV_VAR = "PYPTO_GUTENOCR_SWITCHES"
#: ``=0`` sends every CPU call to the reference (as ``$PYPTO_KERNELS_CPU_SIM=0`` does).
CPU_SIM_ENV = "PYPTO_GUTENOCR_CPU_SIM"
INSTALL_HINT = "pip install 'pypto-kernels-gutenocr[pypto]'"

PACKAGE = KernelPackage(
    "pypto_kernels_gutenocr",
    OPS,
    switches_env=ENV_VAR,
    flag_names=FLAG_NAMES,
    cpu_sim_env=(CPU_SIM_ENV,),
    install_hint=INSTALL_HINT,
)
