"""Keep PyPTO's run files out of the home folder; every test starts from clean state."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from pypto_kernels_common import sim

sim.use_run_folders(Path(tempfile.mkdtemp(prefix="pypto-attention-tests-")))
# Before anything imports pypto: PyPTO reads TILEFWK_CONFIG_PATH once, when its libraries
# load, and without the shim's quiet config every small SIM call draws swim-lane PNGs.
sim.prepare_environment()


@pytest.fixture(autouse=True)
def _clean_state():
    from pypto_kernels_attention.package import OPS, PACKAGE

    before = {op: PACKAGE.switches.is_on(op) for op in OPS}
    for op in OPS:
        PACKAGE.switches.set_switch(op, False)
    PACKAGE.stats.reset()
    yield
    for op, value in before.items():
        PACKAGE.switches.set_switch(op, value)
    PACKAGE.stats.reset()


@pytest.fixture
def pypto_cpu():
    """The PyPTO CPU path (SIM + verify shim), or skip when pypto is absent."""
    pytest.importorskip("pypto")
    from pypto_kernels_attention.package import PACKAGE

    return PACKAGE.backend("cpu")
