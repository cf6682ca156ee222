"""Envelopes, counted fallbacks, the switch, slot padding and the custom op under compile."""

from __future__ import annotations

import logging

import pytest
import torch

from pypto_kernels_attention import ops, reference
from pypto_kernels_attention.package import PACKAGE


def _inputs(b=1, h=4, kv=2, s=16, d=16, dtype=torch.float32, length=None):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, 1, d, generator=g).to(dtype)
    k = torch.randn(b, kv, s, d, generator=g).to(dtype)
    v = torch.randn(b, kv, s, d, generator=g).to(dtype)
    lengths = torch.tensor(length if length is not None else [s] * b)
    return q, k, v, reference.valid_bias(lengths, s)


def test_switch_off_falls_back_counted():
    q, k, v, bias = _inputs()
    out = ops.gqa_decode(q, k, v, bias, 0.25)
    torch.testing.assert_close(out, reference.gqa_decode_reference(q, k, v, bias, 0.25))
    assert PACKAGE.stats.calls()["gqa_decode"] == {"pypto": 0, "reference": 1}
    assert "USE_PTO_GQA_DECODE is off" in PACKAGE.stats.fallback_reasons()["gqa_decode"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda q, k, v, b: (q.expand(1, 4, 2, 16), k, v, b), "2 query tokens"),
        (lambda q, k, v, b: (q[..., :8], k[..., :8], v[..., :8], b), "head_dim 8"),
        (lambda q, k, v, b: (q, k, v, b.to(torch.int64)), "floating tensor"),
        (lambda q, k, v, b: (q.double(), k.double(), v.double(), b), "dtype torch.float64"),
    ],
)
def test_outside_the_envelope_falls_back_logged_once(change, reason, caplog, monkeypatch):
    monkeypatch.setenv("PYPTO_ATTENTION_CPU_SIM", "0")  # never reach a kernel here
    q, k, v, bias = change(*_inputs())
    with PACKAGE.switches.pto_switches(gqa_decode=True), caplog.at_level(logging.WARNING):
        for _ in range(2):
            out = ops.gqa_decode(q, k, v, bias, 0.25)
    assert out.shape == q.shape
    assert PACKAGE.stats.calls()["gqa_decode"] == {"pypto": 0, "reference": 2}
    assert reason in PACKAGE.stats.fallback_reasons()["gqa_decode"]
    assert sum(reason in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda q, k, v, b: (q[:, :3], k, v, b), "3 query heads are not a multiple of 2"),
        (lambda q, k, v, b: (q, k, v, b[:, :5]), r"bias \(1, 5\) must be \[B, S\]"),
    ],
)
def test_malformed_calls_raise_one_line_errors(change, message, monkeypatch):
    """Outside the envelope *and* not attention at all: the fallback names the problem."""
    monkeypatch.setenv("PYPTO_ATTENTION_CPU_SIM", "0")
    with PACKAGE.switches.pto_switches(gqa_decode=True), pytest.raises(ValueError, match=message):
        ops.gqa_decode(*change(*_inputs()), 0.25)


def test_softcap_is_outside_the_envelope():
    q, k, v, bias = _inputs()
    with PACKAGE.switches.pto_switches(gqa_decode=True):
        out = ops.gqa_decode(q, k, v, bias, 0.25, softcap=5.0)
    torch.testing.assert_close(out, reference.gqa_decode_reference(q, k, v, bias, 0.25, 5.0))
    assert "softcapping" in PACKAGE.stats.fallback_reasons()["gqa_decode"]


def test_softmax_envelope_needs_aligned_rows(monkeypatch):
    monkeypatch.setenv("PYPTO_ATTENTION_CPU_SIM", "0")
    x = torch.randn(3, 10)
    with PACKAGE.switches.pto_switches(softmax=True):
        torch.testing.assert_close(ops.softmax(x), torch.softmax(x, -1))
    assert "row length 10" in PACKAGE.stats.fallback_reasons()["softmax"]


def test_padding_hides_the_added_slots():
    q, k, v, bias = _inputs(s=7, length=[7])
    kk, vv, bb = ops._pad_slots(k, v, bias)
    assert kk.shape[2] == vv.shape[2] == bb.shape[1] == 16
    padded = reference.gqa_decode_reference(q, kk, vv, bb, 0.25)
    torch.testing.assert_close(padded, reference.gqa_decode_reference(q, k, v, bias, 0.25))


def test_from_length_builds_the_sliding_bias_on_the_device(monkeypatch):
    monkeypatch.setenv("PYPTO_ATTENTION_CPU_SIM", "0")
    q, k, v, _ = _inputs(s=8)
    length = torch.tensor([11])
    out = ops.gqa_decode_from_length(q, k, v, length, 0.25, window=8)
    bias = reference.valid_bias(length, 8, 8)
    assert bool((bias == 0).all())  # the ring is full: every slot is in the window
    torch.testing.assert_close(out, reference.gqa_decode_reference(q, k, v, bias, 0.25))


def test_compiled_step_keeps_one_opaque_node_and_dispatches_every_call(monkeypatch):
    """The fake implementation lets torch.compile trace the op without running it; each
    call of the compiled function then dispatches (here: counted fallback, no PyPTO)."""
    monkeypatch.setenv("PYPTO_ATTENTION_CPU_SIM", "0")
    torch._dynamo.reset()
    q, k, v, bias = _inputs()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    fn = torch.compile(lambda *a: ops.gqa_decode(*a, 0.25) * 2, backend=backend, fullgraph=True)
    with PACKAGE.switches.pto_switches(gqa_decode=True):
        for _ in range(3):
            out = fn(q, k, v, bias)
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("pypto_attention.gqa_decode" in t for t in targets) == 1, targets
    assert PACKAGE.stats.calls()["gqa_decode"]["reference"] == 3
    torch.testing.assert_close(out, 2 * reference.gqa_decode_reference(q, k, v, bias, 0.25))


@pytest.mark.slow
def test_kernel_runs_on_the_cpu_sim_with_odd_slots_and_two_rows(pypto_cpu):
    q, k, v, bias = _inputs(b=2, s=7, length=[3, 7])
    with PACKAGE.switches.pto_switches(gqa_decode=True):
        out = ops.gqa_decode(q, k, v, bias, 0.25)
    assert PACKAGE.stats.calls()["gqa_decode"] == {"pypto": 1, "reference": 0}
    torch.testing.assert_close(
        out, reference.gqa_decode_reference(q, k, v, bias, 0.25), rtol=1e-5, atol=1e-5
    )


@pytest.mark.slow
def test_softmax_kernel_runs_on_the_cpu_sim(pypto_cpu):
    x = torch.randn(11, 64) * 3
    with PACKAGE.switches.pto_switches(softmax=True):
        out = ops.softmax(x)
    assert PACKAGE.stats.calls()["softmax"] == {"pypto": 1, "reference": 0}
    torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)


@pytest.mark.npu
def test_kernel_runs_on_the_npu():
    """The same kernel in PyPTO's NPU run mode (pypto-kernels-common's npu backend)."""
    from pypto_kernels_common import npu_available

    if not npu_available():
        pytest.skip("no Ascend NPU (torch_npu + CANN) here; the NPU run mode is not exercised")
    q, k, v, bias = (t.to("npu") for t in _inputs(s=64, d=64, dtype=torch.bfloat16))
    with PACKAGE.switches.pto_switches(gqa_decode=True):
        out = ops.gqa_decode(q, k, v, bias, 0.125)
    assert PACKAGE.stats.calls()["gqa_decode"] == {"pypto": 1, "reference": 0}
    want = reference.gqa_decode_reference(*(t.float().cpu() for t in (q, k, v, bias)), 0.125)
    torch.testing.assert_close(out.float().cpu(), want, rtol=0.02, atol=0.02)
