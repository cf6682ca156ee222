"""The device layer's torch_npu table, and the names it picks by torch_npu version.

There is no torch_npu here; the installed version is pinned on a copy of the real table,
so each torch_npu release's spelling is exercised through the same rows that
``nox -s npu_api`` checks against the wheels.
"""

from __future__ import annotations

import logging

import pytest

from pypto_capture import device, npu_names
from pypto_common.npu_api import NpuApi, parse_table


def pinned(monkeypatch, version):
    api = NpuApi(parse_table(npu_names.NPU_API_TABLE), versions={"torch-npu": version})
    monkeypatch.setattr(device, "NPU", api)
    return api


def test_every_kwarg_row_names_a_declared_callable():
    rows = npu_names.NPU.rows
    callables = {r.path for r in rows if r.kind != "kwarg"}
    assert all(r.path in callables for r in rows if r.kind == "kwarg")
    assert all(r.path.startswith("torch_npu") for r in rows)


def test_auto_dispatch_is_passed_where_torch_npu_accepts_it(monkeypatch):
    monkeypatch.setenv(device.AUTO_DISPATCH_ENV, "1")
    for version in ("2.5.1.post1", "2.9.0", "2.12.0"):
        api = pinned(monkeypatch, version)
        options = device.npu_graph_options()
        assert options == {"auto_dispatch_capture": True}
        assert api.kwargs("torch_npu.npu.graph", pool=None, stream=None, **options)


def test_auto_dispatch_is_dropped_on_torch_npu_2_5_1(monkeypatch, caplog):
    """torch_npu 2.5.1's graph() has no auto_dispatch_capture (found by nox -s npu_api):
    passing it would be a TypeError inside torch_npu at capture time."""
    monkeypatch.setenv(device.AUTO_DISPATCH_ENV, "1")
    api = pinned(monkeypatch, "2.5.1")
    with caplog.at_level(logging.WARNING, logger="pypto_capture.device"):
        assert device.npu_graph_options() == {}
    assert "torch_npu 2.5.1 has no torch.npu.graph(auto_dispatch_capture=)" in caplog.text
    with pytest.raises(TypeError):
        api.kwargs("torch_npu.npu.graph", auto_dispatch_capture=True)


def test_auto_dispatch_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv(device.AUTO_DISPATCH_ENV, raising=False)
    pinned(monkeypatch, "2.12.0")
    assert device.npu_graph_options() == {}


def test_undeclared_torch_npu_names_cannot_be_reached():
    mod = npu_names.NpuModule()
    assert not hasattr(mod, "set_device")  # real torch.npu has it; the table does not
    with pytest.raises(AttributeError, match=r"not declared in pypto_capture\.npu_names"):
        mod.make_graphed_callables  # noqa: B018


def test_declared_names_without_torch_npu_are_missing_not_crashing():
    assert not hasattr(npu_names.NpuModule(), "NPUGraph")  # torch_npu is not installed here
    assert device.npu_available() is False
