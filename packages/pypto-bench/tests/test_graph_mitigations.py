"""Capture mitigations in the graph arms (issue 27, item 17): the prefill graph arm applies
what the decode graph arm applies on an NPU, decided by the same rule, and both arms'
details say what was applied."""

from __future__ import annotations

import pytest
import torch

from pypto_bench import BenchConfig, open_session, run_bench
from pypto_bench.config import GRAPH_BACKENDS
from pypto_bench.protocol import Memory as _Memory
from pypto_bench.protocol.prefill import run_eager_prefill as _run_eager_prefill
from pypto_bench.protocol.prefill import run_graph_prefill as _run_graph_prefill
from pypto_bench.report import ArmResult

SMALL = {"device": "cpu", "dtype": "float32", "warmup": 0, "iters": 1, "measure_bandwidth": False}

#: The NPU graph backends: what decode's runner mitigates for (``auto`` is npugraph there,
#: ``fused`` is torchair's NPU graph).
NPU_GRAPHS = {"auto", "npugraph", "fused"}


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
def test_prefill_selects_decode_s_mitigations_for_an_npu(backend):
    """The selection both graph arms call, with every --graph-backend the CLI accepts and
    the device type "npu" (no NPU needed to ask)."""
    from pypto_capture import needs_capture_mitigations

    config = BenchConfig(model_path="unused", graph_backend=backend)
    config.validate()
    assert needs_capture_mitigations(config.graph_backend, "npu") is (backend in NPU_GRAPHS)
    # the same backend on this CPU run needs none (the compile backend captures as is)
    assert needs_capture_mitigations(config.graph_backend, "cpu") is (backend == "npugraph")


def test_decode_runner_applies_them_for_a_real_npugraph_backend_object(tiny_llama):
    """The decode runner's own choice, made with a real backend object named npugraph
    (constructing it captures nothing), is the rule's answer."""
    from transformers import AutoModelForCausalLM

    from pypto_capture import DecodeStepRunner, DeviceGraphBackend, make_backend

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama)).eval()
    cpu = torch.device("cpu")
    for backend, applied in (
        (DeviceGraphBackend(cpu, "npugraph"), True),
        (make_backend("compile", cpu), False),
    ):
        runner = DecodeStepRunner(model, batch_size=1, max_cache_len=8, backend=backend)
        try:
            assert (runner.mitigations is not None) is applied
            if applied:
                assert "attn:sdpa->eager" in runner.mitigations.applied
        finally:
            runner.close()
    assert model.config._attn_implementation == "sdpa"  # undone


def test_graph_arms_report_the_mitigations_they_applied(tiny_llama):
    report = run_bench(
        BenchConfig(
            model_path=str(tiny_llama),
            regime="decode",
            seq=6,
            gen=4,
            arms=("graph",),
            graph_backend="eager",
            **SMALL,
        )
    )
    graph = report.arm("graph")
    assert report.ok, graph.error
    # a capture on the CPU needs none, and the report says so and why
    assert graph.details["mitigations"]["applied"] == []
    assert "eager capture on cpu needs none" in graph.details["mitigations"]["why"]


def test_prefill_graph_arm_applies_the_npu_mitigations_and_lists_them(tiny_llama):
    """The NPU path's patches (forced here: the rule says none on a CPU) on a real captured
    prefill: eager attention, rotary tables, the model's masks recorded and prebuilt; the
    tokens stay the eager arm's and the model is restored afterwards."""
    session = open_session(
        BenchConfig(
            model_path=str(tiny_llama),
            regime="prefill",
            seq=8,
            batch=2,
            graph_backend="compile",
            **SMALL,
        )
    )
    ctx = session._ctx
    eager = _run_eager_prefill(ctx, ArmResult(name="eager"), _Memory(ctx.device))

    plain = ArmResult(name="graph")
    _run_graph_prefill(ctx, plain, _Memory(ctx.device))
    assert plain.details["mitigations"]["applied"] == []

    arm = ArmResult(name="graph")
    tokens = _run_graph_prefill(ctx, arm, _Memory(ctx.device), mitigate=True)
    applied = arm.details["mitigations"]["applied"]
    assert "attn:sdpa->eager" in applied
    assert any(a.startswith("rotary:") and "x 8)" in a for a in applied)  # tables of --seq
    assert any(a.startswith("mask:") and a.endswith("create_causal_mask") for a in applied)
    assert "prebuilt-mask:full_attention" in applied
    assert "107025" in arm.details["mitigations"]["why"]
    assert torch.equal(tokens, eager)
    # the terminal table and the markdown say it in one line per arm
    from pypto_bench.report import format_table, new_report, report_to_markdown

    report = new_report(ctx.config, device=ctx.device, device_name="cpu")
    report.arms = [arm]
    report.finish()
    assert "graph: capture mitigations: attn:sdpa->eager, mask:" in format_table(report)
    assert "`graph` capture mitigations: attn:sdpa->eager" in report_to_markdown(report)
    assert ctx.model.config._attn_implementation == "sdpa"
    assert all(
        "forward" not in vars(m) for m in ctx.model.modules() if "Rotary" in type(m).__name__
    )
