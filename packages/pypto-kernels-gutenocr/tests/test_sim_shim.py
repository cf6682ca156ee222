"""The CPU shim is pypto-kernels-common's (its own tests live there): one object, this
package's install hint, and this package's off switch."""

import importlib

import pytest

from pypto_kernels_common import sim
from pypto_kernels_gutenocr import costmodel, kernels, sim_shim


def test_sim_shim_is_the_shared_module_not_a_copy():
    assert sim_shim is sim
    import pypto_kernels_gutenocr.sim_shim as again

    assert again is sim


def test_errors_name_this_packages_install(monkeypatch):
    monkeypatch.setattr(sim_shim, "installed_version", lambda: None)
    # A backend built earlier in this process is cached: start from none.
    importlib.import_module("pypto_kernels_common.backend")._backend.cache_clear()
    assert "pip install 'pypto-kernels-gutenocr[pypto]'" in (costmodel.availability() or "")
    with pytest.raises(sim.SimUnavailableError, match=r"pypto-kernels-gutenocr\[pypto\]"):
        kernels.backend("cpu")


def test_the_packages_own_off_switch_still_works(monkeypatch):
    monkeypatch.setenv("PYPTO_GUTENOCR_CPU_SIM", "0")
    with pytest.raises(sim.SimUnavailableError, match="disabled by PYPTO_GUTENOCR_CPU_SIM=0"):
        kernels.backend("cpu")
