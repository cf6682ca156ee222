"""The dispatch rule through a tiny package built on this one (``toy_kernels``)."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from pypto_kernels_common import Envelope, KernelError, KernelPackage, PackCache


@pytest.fixture
def toy(toy_path):
    import toy_kernels

    toy_kernels.PACKAGE.stats.reset()
    with toy_kernels.PACKAGE.switches.pto_switches(add=True):
        yield toy_kernels
    toy_kernels.PACKAGE.stats.reset()


def test_switch_off_is_a_counted_fallback(toy):
    a, b = torch.randn(2, 64), torch.randn(2, 64)
    with toy.PACKAGE.switches.pto_switches(add=False):
        torch.testing.assert_close(toy.add(a, b), a + b)
        rep = toy.PACKAGE.report()
    assert rep["switches"] == {"USE_PTO_ADD": False}
    assert rep["calls"]["add"] == {"pypto": 0, "reference": 1}
    assert rep["fallback_reasons"]["add"] == "switch USE_PTO_ADD is off"


def test_outside_the_envelope_falls_back_logged_once_and_counted(toy, caplog):
    caplog.set_level(logging.WARNING, logger="toy_kernels")
    a, b = torch.randn(2, 100), torch.randn(2, 100)
    for _ in range(3):
        torch.testing.assert_close(toy.add(a, b), a + b)
    assert toy.PACKAGE.stats.calls()["add"] == {"pypto": 0, "reference": 3}
    logged = [r for r in caplog.records if "falling back" in r.getMessage()]
    assert len(logged) == 1
    assert "width 100 outside envelope" in logged[0].getMessage()


@pytest.mark.parametrize("var", ["PYPTO_KERNELS_CPU_SIM", "TOY_KERNELS_CPU_SIM"])
def test_cpu_path_can_be_turned_off_generically_or_per_package(toy, monkeypatch, var):
    monkeypatch.setenv(var, "0")
    a = torch.randn(2, 64)
    torch.testing.assert_close(toy.add(a, a), a + a)
    assert toy.PACKAGE.stats.fallback_reasons()["add"] == f"CPU SIM path disabled by {var}=0"


def test_a_device_pypto_cannot_run_on_is_a_reason_not_an_error(toy):
    assert toy.PACKAGE.backend_or_reason("cuda") == (
        None,
        "PyPTO has no backend for cuda tensors",
    )
    a = torch.randn(2, 64, device="meta")
    toy.add(a, a)
    assert "device meta outside envelope" in toy.PACKAGE.stats.fallback_reasons()["add"]


def test_kernel_errors_raise_instead_of_falling_back(toy):
    def boom():
        raise RuntimeError("compile failed")

    with pytest.raises(KernelError, match=r"^PyPTO add kernel failed: compile failed$"):
        toy.PACKAGE.run("add", boom)
    assert toy.PACKAGE.stats.calls()["add"] == {"pypto": 0, "reference": 0}


@pytest.mark.slow
def test_inside_the_envelope_the_kernel_runs_counted_and_cleans_up(toy, pypto_cpu):
    a, b = torch.randn(8, 64), torch.randn(8, 64)
    out = toy.add(a, b)
    assert toy.PACKAGE.stats.calls()["add"] == {"pypto": 1, "reference": 0}
    torch.testing.assert_close(out, a + b)  # real inputs (the 0.2.0 defect gives zeros)
    mine = f"_{os.getpid()}_"
    assert not [n for n in os.listdir(os.environ["TILE_FWK_OUTPUT_DIR"]) if mine in n]


def test_envelope_index_dtypes_are_not_mixed_dtypes():
    rule_seen = []
    env = Envelope(
        "gather",
        index_dtypes=(torch.int64,),
        rules=(lambda x, ids: rule_seen.append(ids.dtype),),
    )
    x, ids = torch.randn(4, 64), torch.tensor([0, 3])
    assert env.violation([x, ids]) is None
    assert rule_seen == [torch.int64]
    assert "mixed dtypes" in (Envelope("plain").violation([x, ids]) or "")
    assert "float64" in (env.violation([x.double(), ids]) or "")


def test_envelope_refuses_autograd_and_other_devices():
    x = torch.randn(2, 64, requires_grad=True)
    assert "autograd" in (Envelope("op").violation([x]) or "")
    with torch.no_grad():
        assert Envelope("op").violation([x]) is None
    assert "device cpu outside" in (Envelope("op", devices=("npu",)).violation([x.detach()]) or "")


def test_pack_cache_packs_once_and_repacks_after_an_in_place_change():
    cache = PackCache()
    w = torch.randn(4, 3)
    a = cache.packed(w, lambda t: t.t().contiguous() * 2)
    assert cache.packed(w, lambda t: pytest.fail("packed twice")) is a
    with torch.no_grad():
        w.add_(1)
    torch.testing.assert_close(cache.transposed(w), w.t())
    assert cache.packs == 2
    del w, a
    assert not cache._cache


def test_a_package_with_no_ops_or_bad_flags_is_refused():
    with pytest.raises(ValueError, match="at least one op"):
        KernelPackage("x", (), switches_env="X_SWITCHES")
    with pytest.raises(ValueError, match="flag_names must name exactly"):
        KernelPackage("x", ("a",), switches_env="X_SWITCHES", flag_names={"b": "USE_B"})
