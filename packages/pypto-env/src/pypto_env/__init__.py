"""Which torch / torch_npu this machine's CANN needs, before torch is installed.

Standard library only: importing this package never imports torch.
"""

from .detect import (
    CannInstall,
    Detection,
    default_roots,
    detect_cann,
    find_cann,
    installed_versions,
)
from .errors import EXIT
from .matrix import (
    MatrixError,
    MatrixRow,
    Pins,
    UnknownCannVersionError,
    UnpairedRelease,
    cann_for_torch,
    cann_release,
    known_cann_versions,
    load_matrix,
    load_unpaired,
    pins_for,
    rows_for,
    torch_versions_for,
)

__version__ = "0.1.0"

__all__ = [
    "EXIT",
    "CannInstall",
    "Detection",
    "MatrixError",
    "MatrixRow",
    "Pins",
    "UnknownCannVersionError",
    "UnpairedRelease",
    "cann_for_torch",
    "cann_release",
    "default_roots",
    "detect_cann",
    "find_cann",
    "installed_versions",
    "known_cann_versions",
    "load_matrix",
    "load_unpaired",
    "pins_for",
    "rows_for",
    "torch_versions_for",
]
