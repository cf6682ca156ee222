"""Keep PyPTO's run files out of the home folder and the working directory.

PyPTO reads these when its libraries load, so they are set before any test can
import it. The calculator build cache (pypto-kernels-common's ``PYPTO_KERNELS_CACHE``)
defaults to the user cache so the ~23 s cmake build happens once per (pypto, torch) pair.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from pypto_kernels_common import sim

sim.use_run_folders(Path(tempfile.mkdtemp(prefix="pypto-gutenocr-tests-")))
# Before anything imports pypto: PyPTO reads TILEFWK_CONFIG_PATH once, when its libraries
# load, and without the shim's quiet config every small SIM call draws swim-lane PNGs.
sim.prepare_environment()


@pytest.fixture(autouse=True)
def _clean_state():
    """Every test starts with switches off, zero counters and an empty pack cache."""
    from pypto_kernels_gutenocr import PACKED, stats, switches

    before = {op: switches.is_on(op) for op in switches.OPS}
    for op in switches.OPS:
        switches.set_switch(op, False)
    stats.reset()
    PACKED.clear()
    yield
    for op, value in before.items():
        switches.set_switch(op, value)
    stats.reset()


@pytest.fixture
def pypto_cpu():
    """The PyPTO CPU path (SIM + verify shim), or skip when pypto is absent."""
    pytest.importorskip("pypto")
    from pypto_kernels_gutenocr import kernels

    return kernels.backend("cpu")
