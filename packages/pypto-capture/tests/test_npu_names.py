"""The device layer's torch_npu table: only declared names resolve, and a keyword that
one torch_npu release lacks is dropped by asking the installed callable.

There is no torch_npu here; a stand-in module with the two real ``torch.npu.graph``
signatures (2.5.1: no ``auto_dispatch_capture``; 2.5.1.post1 and later: with it, as
``nox -s npu_api`` found in the wheels) is put in ``sys.modules`` for the keyword tests.
"""

from __future__ import annotations

import logging
import sys
import types

import pytest

from pypto_capture import device, npu_names


def _fake_torch_npu(monkeypatch, *, with_auto_dispatch: bool) -> None:
    class graph:
        if with_auto_dispatch:

            def __init__(self, npu_graph, pool=None, stream=None, auto_dispatch_capture=False):
                pass
        else:

            def __init__(self, npu_graph, pool=None, stream=None):
                pass

    top = types.ModuleType("torch_npu")
    npu = types.ModuleType("torch_npu.npu")
    npu.graph = graph
    top.npu = npu
    monkeypatch.setitem(sys.modules, "torch_npu", top)
    monkeypatch.setitem(sys.modules, "torch_npu.npu", npu)


def test_every_kwarg_row_names_a_declared_callable():
    names = npu_names.NPU
    assert names.keywords  # the table has keyword rows
    assert all(path in names.paths for path in names.keywords)
    assert all(p.startswith(("torch_npu", "torchair")) for p in names.paths)
    assert "auto_dispatch_capture" in names.keywords["torch_npu.npu.graph"]


def test_auto_dispatch_is_passed_where_torch_npu_accepts_it(monkeypatch):
    monkeypatch.setenv(device.AUTO_DISPATCH_ENV, "1")
    _fake_torch_npu(monkeypatch, with_auto_dispatch=True)
    options = device.npu_graph_options()
    assert options == {"auto_dispatch_capture": True}
    assert npu_names.NPU.kwargs("torch_npu.npu.graph", pool=None, stream=None, **options)


def test_auto_dispatch_is_dropped_where_torch_npu_lacks_it(monkeypatch, caplog):
    """torch_npu 2.5.1's graph() has no auto_dispatch_capture (found by nox -s npu_api):
    passing it would be a TypeError inside torch_npu at capture time."""
    monkeypatch.setenv(device.AUTO_DISPATCH_ENV, "1")
    _fake_torch_npu(monkeypatch, with_auto_dispatch=False)
    with caplog.at_level(logging.WARNING, logger="pypto_capture.device"):
        assert device.npu_graph_options() == {}
    assert "has no torch.npu.graph(auto_dispatch_capture=)" in caplog.text


def test_auto_dispatch_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv(device.AUTO_DISPATCH_ENV, raising=False)
    assert device.npu_graph_options() == {}


def test_undeclared_names_and_keywords_are_refused():
    mod = npu_names.NpuModule()
    assert not hasattr(mod, "set_device")  # real torch.npu has it; the table does not
    with pytest.raises(AttributeError, match=r"not declared in pypto_capture\.npu_names"):
        mod.make_graphed_callables  # noqa: B018
    with pytest.raises(TypeError, match="not declared"):
        npu_names.NPU.kwargs("torch_npu.npu.graph", capture_error_mode="global")


def test_declared_names_without_torch_npu_are_missing_not_crashing():
    assert not hasattr(npu_names.NpuModule(), "NPUGraph")  # torch_npu is not installed here
    assert device.npu_available() is False
