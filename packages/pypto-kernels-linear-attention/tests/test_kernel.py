"""The kernels on the CPU SIM + verify shim against the references; the envelopes' counted
fallbacks; the custom ops under torch.compile; PyPTO's in-place refusal pinned."""

from __future__ import annotations

import logging

import pytest
import torch
from _la_inputs import gdn_inputs, kda_inputs

from pypto_kernels_linear_attention import (
    PACKAGE,
    gated_delta_step,
    gated_delta_step_reference,
    kda_step,
    kda_step_reference,
)


def _both(op, ref, x):
    want_state = x["state"].clone()
    want = ref(**{**x, "state": want_state})
    got = op(**x)
    return got, want, x["state"], want_state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_delta_kernel_equals_reference(pypto_cpu, dtype):
    x = gdn_inputs(bsz=2, hk=2, hv=6, dtype=dtype)  # 3 value heads per key head
    with PACKAGE.switches.pto_switches(gated_delta_step=True):
        got, want, state, want_state = _both(gated_delta_step, gated_delta_step_reference, x)
    assert PACKAGE.stats.calls()["gated_delta_step"] == {"pypto": 1, "reference": 0}
    # same operations in the same order: fp32 within an ulp or two, bf16 bit for bit here
    tol = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 0, "atol": 0}
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(state, want_state, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kda_kernel_equals_reference(pypto_cpu, dtype):
    x = kda_inputs(bsz=2, dtype=dtype)
    with PACKAGE.switches.pto_switches(kda_step=True):
        got, want, state, want_state = _both(kda_step, kda_step_reference, x)
    assert PACKAGE.stats.calls()["kda_step"] == {"pypto": 1, "reference": 0}
    tol = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 0, "atol": 0}
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(state, want_state, rtol=1e-6, atol=1e-6)


def test_pypto_refuses_a_loop_that_reads_and_assembles_one_parameter(pypto_cpu):
    """Why the kernels take ``state`` and ``new_state`` (bound to one tensor): PyPTO 0.2.0
    rejects the single-parameter form. If this starts passing, upstream changed: the
    kernels could then take the state once."""
    import subprocess
    import sys
    from pathlib import Path

    probe = Path(__file__).with_name("_inplace_probe.py")
    out = subprocess.run(
        [sys.executable, str(probe)], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    assert "refused" in out, out[-2000:]
    assert "F21007" in out or "already in a group" in out, out[-2000:]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            {"state": torch.zeros(1, 4, 16, 16, dtype=torch.bfloat16)},
            "state dtype torch.bfloat16 is not float32",
        ),
        ({"state": torch.zeros(1, 4, 16, 16).transpose(2, 3)}, "state is not contiguous"),
        ({"state": torch.zeros(1, 4, 16, 8)}, r"state \(1, 4, 16, 8\) must be \[1, 4, 16, 16\]"),
        (
            {"v": torch.zeros(1, 3, 16), "z": torch.zeros(1, 3, 16)},
            "3 value heads over 2 key heads",
        ),
        (
            {"q": torch.zeros(1, 2, 12), "k": torch.zeros(1, 2, 12)},
            "head dims 12 x 16 outside envelope",
        ),
        ({"A_log": torch.zeros(5)}, "A_log has 5 values, not 4"),
        ({"q": torch.zeros(1, 0, 16), "k": torch.zeros(1, 0, 16)}, "empty heads"),
        ({"norm_weight": torch.ones(16, dtype=torch.int64)}, "norm_weight dtype torch.int64"),
        ({"a": torch.zeros(1, 4, dtype=torch.float16)}, "mixed dtypes"),
        ({"q": torch.zeros(1, 2, 16, dtype=torch.int32)}, "mixed dtypes|dtype torch.int32"),
    ],
)
def test_outside_the_envelope_falls_back_counted_with_the_reason(change, reason, caplog):
    x = {**gdn_inputs(), **change}
    with PACKAGE.switches.pto_switches(gated_delta_step=True), caplog.at_level(logging.WARNING):
        try:
            gated_delta_step(**x)
        except (RuntimeError, ValueError, IndexError):
            pass  # the reference itself may refuse a malformed call; the count is what matters
    calls = PACKAGE.stats.calls()["gated_delta_step"]
    assert calls == {"pypto": 0, "reference": 1}
    assert pytest.importorskip("re").search(
        reason, PACKAGE.stats.fallback_reasons()["gated_delta_step"]
    )


def test_switch_off_runs_the_reference_counted():
    x = kda_inputs()
    want_state = x["state"].clone()
    want = kda_step_reference(**{**x, "state": want_state})
    got = kda_step(**x)
    assert torch.equal(got, want)
    assert torch.equal(x["state"], want_state)
    assert PACKAGE.report()["fallback_reasons"]["kda_step"] == "switch USE_PTO_KDA_STEP is off"


def test_cpu_sim_off_falls_back(monkeypatch):
    monkeypatch.setenv("PYPTO_LINEAR_ATTENTION_CPU_SIM", "0")
    with PACKAGE.switches.pto_switches(gated_delta_step=True):
        gated_delta_step(**gdn_inputs())
    assert (
        "PYPTO_LINEAR_ATTENTION_CPU_SIM=0" in PACKAGE.stats.fallback_reasons()["gated_delta_step"]
    )


def test_env_var_and_module_flags_set_the_switches(monkeypatch):
    import pypto_kernels_linear_attention as la

    la.USE_PTO_KDA_STEP = True
    assert PACKAGE.switches.is_on("kda_step")
    assert la.USE_PTO_KDA_STEP
    monkeypatch.setenv("PYPTO_LINEAR_ATTENTION_SWITCHES", "gated_delta_step")
    assert PACKAGE.switches.load_from_env() == {"gated_delta_step": True, "kda_step": False}
    monkeypatch.setenv("PYPTO_LINEAR_ATTENTION_SWITCHES", "delta")
    with pytest.raises(ValueError, match="unknown op 'delta'"):
        PACKAGE.switches.load_from_env()


@pytest.mark.slow
def test_compiled_step_runs_the_kernel_op_on_every_call(pypto_cpu):
    """Under torch.compile a switched-on call is the opaque custom op (fake impl at trace
    time) that mutates the state: every call of the compiled function runs the kernel."""

    def step(x):
        return gated_delta_step(**x)

    compiled = torch.compile(step, fullgraph=True)
    x = gdn_inputs()
    ref_state = x["state"].clone()
    with PACKAGE.switches.pto_switches(gated_delta_step=True), torch.no_grad():
        for _ in range(3):
            got = compiled(x)
            want = gated_delta_step_reference(**{**x, "state": ref_state})
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x["state"], ref_state, rtol=1e-5, atol=1e-6)
    assert PACKAGE.stats.calls()["gated_delta_step"] == {"pypto": 3, "reference": 0}
