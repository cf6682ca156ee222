"""Keep PyPTO's run files out of the home folder and the working directory.

PyPTO reads these when its libraries load, so they are set before any test can
import it. The calculator build cache (``PYPTO_KERNELS_CACHE``) defaults to the user
cache so the ~23 s cmake build happens once per (pypto, torch) pair.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from pypto_kernels_common import sim

sim.use_run_folders(Path(tempfile.mkdtemp(prefix="pypto-kernels-common-tests-")))
# Before anything imports pypto: PyPTO reads TILEFWK_CONFIG_PATH once, when its libraries
# load, and without the shim's quiet config every small SIM call draws swim-lane PNGs.
sim.prepare_environment()

TESTS = Path(__file__).parent


@pytest.fixture
def pypto_cpu():
    """The PyPTO CPU path (SIM + verify shim), or skip when pypto is absent."""
    pytest.importorskip("pypto")
    from pypto_kernels_common import backend

    return backend("cpu")


@pytest.fixture
def toy_path(monkeypatch) -> Path:
    """``toy_kernels`` importable here and in child processes (the Simulator's worker)."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    )
    return TESTS
