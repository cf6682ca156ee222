"""Keep PyPTO's run files out of the home folder; every test starts switched off."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

from pypto_kernels_common import sim

# _moe_fixtures (tiny transformers experts modules) importable under importlib mode.
sys.path.insert(0, str(Path(__file__).parent))

sim.use_run_folders(Path(tempfile.mkdtemp(prefix="pypto-moe-tests-")))
# Before anything imports pypto (pytest.importorskip("pypto") does): PyPTO reads
# TILEFWK_CONFIG_PATH once, when its libraries load. Without the shim's quiet config
# the cost model keeps its default Model.drawPngThresholdCycle (500000) and every SIM
# call under that many cycles runs three matplotlib swim-lane scripts (seconds to a
# minute each).
sim.prepare_environment()


@pytest.fixture(autouse=True)
def _clean_state():
    from pypto_kernels_moe import PACKAGE

    before = PACKAGE.switches.is_on("grouped_gemm")
    PACKAGE.switches.set_switch("grouped_gemm", False)
    PACKAGE.stats.reset()
    yield
    PACKAGE.switches.set_switch("grouped_gemm", before)
    PACKAGE.stats.reset()


@pytest.fixture
def pypto_cpu():
    """The PyPTO CPU path (SIM + verify shim), or skip when pypto is absent."""
    pytest.importorskip("pypto")
    from pypto_kernels_moe import kernels

    return kernels.backend("cpu")
