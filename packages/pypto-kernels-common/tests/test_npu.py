"""The declared NPU names: the table parses, the code uses only declared names, and the
pypto rows resolve in the installed pypto (torch_npu rows need the wheels: issue #19)."""

from __future__ import annotations

import inspect

import pytest

from pypto_common.npu_api import KINDS
from pypto_kernels_common import Backend, npu, npu_available


def test_table_rows_are_well_formed():
    assert npu.NPU_API
    for row in npu.NPU_API:
        assert row.kind in KINDS, row
        assert row.source, row
        assert (row.kwarg is not None) == (row.kind in ("kwarg", "key")), row
    paths = {r.path for r in npu.NPU_API}
    assert {"pypto.RunMode.NPU", "pypto.frontend.jit", "torch_npu.npu.is_available"} <= paths


def test_undeclared_names_and_keywords_are_refused():
    with pytest.raises(KeyError, match=r"pypto\.RunMode\.CUDA is not declared"):
        npu.api("pypto.RunMode.CUDA")
    with pytest.raises(KeyError, match=r"\['debug_options'\]"):
        npu.kwargs("pypto.frontend.jit", debug_options={})
    with pytest.raises(KeyError, match=r"\['runtime_options.device_id'\]"):
        npu.options("pypto.frontend.jit", "runtime_options", device_id=0)


def test_pypto_rows_resolve_and_keywords_exist_in_the_installed_pypto():
    """A small version of issue #19's checker, for the one wheel installed here."""
    pytest.importorskip("pypto")
    from pypto_kernels_common import sim

    sim.import_pypto()
    for row in npu.NPU_API:
        if not row.path.startswith("pypto"):
            continue
        if row.kind in ("kwarg", "key"):
            params = inspect.signature(npu.api(row.path)).parameters
            assert (row.kwarg or "").split(".")[0] in params, row
        else:
            assert npu.api(row.path) is not None, row


def test_npu_backend_asks_for_the_npu_run_mode_through_the_table():
    pytest.importorskip("pypto")
    from pypto_kernels_common import sim

    pypto = sim.import_pypto()
    opts = Backend(pypto, "npu").jit_options()
    assert opts == {"runtime_options": {"run_mode": pypto.RunMode.NPU}}
    assert "verify_options" not in opts  # the precision tool is a CPU-only workaround


def test_no_npu_here(monkeypatch):
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    assert npu_available() is False
    monkeypatch.setenv("ASCEND_HOME_PATH", "/nonexistent")
    assert npu_available() is False  # no torch_npu installed: False, not ImportError


@pytest.mark.npu
def test_npu_backend_runs_on_a_real_npu():
    if not npu_available():
        pytest.skip("no Ascend NPU here (torch_npu + CANN); the NPU path is checked by the table")
