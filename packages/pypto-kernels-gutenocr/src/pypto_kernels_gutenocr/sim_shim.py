"""Kept for imports written before pypto-kernels-common: it *is* ``pypto_kernels_common.sim``.

The module replaces itself with the shared one, so ``pypto_kernels_gutenocr.sim_shim``
and ``pypto_kernels_common.sim`` are the same object (patching one patches the other).
"""

import sys

from pypto_kernels_common import sim

__all__ = list(sim.__all__)  # this module *is* pypto_kernels_common.sim

sys.modules[__name__] = sim
