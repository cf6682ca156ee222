import logging

import pytest
import torch

import pypto_kernels_gutenocr as pk
from pypto_kernels_gutenocr import PACKED, ops, stats
from pypto_kernels_gutenocr.package import PACKAGE


class MLP(torch.nn.Module):
    def __init__(self, h=64, i=128, bias=False, dtype=torch.float32):
        super().__init__()
        self.gate_proj = torch.nn.Linear(h, i, bias=bias, dtype=dtype)
        self.up_proj = torch.nn.Linear(h, i, bias=bias, dtype=dtype)
        self.down_proj = torch.nn.Linear(i, h, bias=False, dtype=dtype)
        self.act_fn = torch.nn.SiLU()


def test_switch_off_uses_reference_and_counts_it():
    x, w = torch.randn(2, 64), torch.randn(64)
    y = pk.rms_norm_wrapper(x, w, 1e-6)
    torch.testing.assert_close(y, pk.rms_norm_reference(x, w, 1e-6))
    rep = pk.report()
    assert rep["calls"]["rms_norm"] == {"pypto": 0, "reference": 1}
    assert "off" in rep["fallback_reasons"]["rms_norm"]


@pytest.mark.parametrize(
    ("x", "w", "reason"),
    [
        (torch.randn(2, 100), torch.randn(100), "hidden 100 outside envelope"),
        (
            torch.randn(2, 64, dtype=torch.float64),
            torch.randn(64, dtype=torch.float64),
            "dtype torch.float64",
        ),
        (torch.randn(2, 64), torch.randn(64, dtype=torch.bfloat16), "mixed dtypes"),
        (torch.randn(2, 64), torch.randn(1, 64), "weight shape"),
    ],
)
def test_outside_the_envelope_falls_back_once_logged_and_counted(caplog, x, w, reason):
    caplog.set_level(logging.WARNING, logger="pypto_kernels_gutenocr")
    with pk.pto_switches(rms_norm=True):
        for _ in range(3):
            y = pk.rms_norm_wrapper(x, w, 1e-6)
    torch.testing.assert_close(y, pk.rms_norm_reference(x, w, 1e-6))
    assert stats.calls()["rms_norm"] == {"pypto": 0, "reference": 3}
    assert reason in stats.fallback_reasons()["rms_norm"]
    logged = [r for r in caplog.records if "falling back" in r.getMessage()]
    assert len(logged) == 1
    assert reason in logged[0].getMessage()


def test_cpu_path_disabled_is_a_counted_fallback(monkeypatch):
    monkeypatch.setenv("PYPTO_GUTENOCR_CPU_SIM", "0")
    q, k = torch.randn(1, 4, 3, 128), torch.randn(1, 2, 3, 128)
    cos, sin = torch.rand(3, 1, 3, 128), torch.rand(3, 1, 3, 128)
    with pk.pto_switches(mrope=True):
        got = pk.mrope_pto_correct(q, k, cos, sin, [16, 24, 24])
    want = pk.mrope_reference(q, k, cos, sin, [16, 24, 24])
    torch.testing.assert_close(got, want)
    assert stats.calls()["mrope"]["reference"] == 1
    assert "PYPTO_GUTENOCR_CPU_SIM=0" in stats.fallback_reasons()["mrope"]


def test_mrope_rejects_sections_that_do_not_cover_head_dim():
    q, k = torch.randn(1, 4, 3, 128), torch.randn(1, 2, 3, 128)
    cos = torch.rand(3, 1, 3, 128)
    with (
        pk.pto_switches(mrope=True),
        pytest.raises(ValueError, match="does not cover head_dim 128"),
    ):
        pk.mrope_pto_correct(q, k, cos, cos, [16, 24, 16])


def test_swiglu_fallbacks_never_call_the_module_forward(monkeypatch):
    monkeypatch.setenv("PYPTO_GUTENOCR_CPU_SIM", "0")
    mlp = MLP(h=64, i=128, bias=True)
    mlp.forward = lambda *_: pytest.fail("forward must not be re-entered")  # the hook's own forward
    x = torch.randn(3, 64)
    with pk.pto_switches(swiglu_mlp=True), torch.no_grad():
        y = pk.swiglu_mlp_wrapper(mlp, x)
    want = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(y, want)
    assert stats.fallback_reasons()["swiglu_mlp"] == "MLP projections carry a bias"


def test_weights_are_packed_once_per_tensor_and_repacked_after_in_place_change():
    w = torch.randn(128, 64)
    a = PACKED.transposed(w)
    b = PACKED.transposed(w)
    assert a is b
    assert PACKED.packs == 1
    assert a.shape == (64, 128)
    assert a.is_contiguous()
    with torch.no_grad():
        w.mul_(2)
    c = PACKED.transposed(w)
    assert PACKED.packs == 2
    torch.testing.assert_close(c, w.t())
    del w, a, b, c
    assert not PACKED._cache  # entry dropped with its weight


def test_swiglu_wrapper_does_not_repack_per_call(monkeypatch):
    monkeypatch.setenv("PYPTO_GUTENOCR_CPU_SIM", "0")  # packing happens before the backend check
    mlp = MLP()
    with pk.pto_switches(swiglu_mlp=True), torch.no_grad():
        for _ in range(4):
            pk.swiglu_mlp_wrapper(mlp, torch.randn(2, 64))
    assert PACKED.packs == 3


def test_kernel_errors_raise_instead_of_falling_back():
    def boom():
        raise RuntimeError("compile failed")

    with pytest.raises(ops.KernelError, match="PyPTO rms_norm kernel failed: compile failed"):
        PACKAGE.run("rms_norm", boom)
    assert stats.calls()["rms_norm"] == {"pypto": 0, "reference": 0}
