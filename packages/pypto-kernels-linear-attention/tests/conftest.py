"""Keep PyPTO's run files out of the home folder; every test starts switched off."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

from pypto_kernels_common import sim

# _la_inputs importable under importlib mode.
sys.path.insert(0, str(Path(__file__).parent))

sim.use_run_folders(Path(tempfile.mkdtemp(prefix="pypto-linear-attention-tests-")))
# Before anything imports pypto: PyPTO reads TILEFWK_CONFIG_PATH once, when its libraries
# load (the shim's quiet config stops the cost model's swim-lane scripts).
sim.prepare_environment()


@pytest.fixture(autouse=True)
def _clean_state():
    from pypto_kernels_linear_attention import PACKAGE

    before = {op: PACKAGE.switches.is_on(op) for op in PACKAGE.ops}
    for op in PACKAGE.ops:
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
    from pypto_kernels_linear_attention import kernels

    return kernels.backend("cpu")
