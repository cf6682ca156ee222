"""--moe-routing on a real MoE model (a tiny MiniMax-M2.7 folder, native transformers).

The graph arm runs the experts exactly (pypto_capture.apply_exact_moe) by default: its
tokens equal eager's. ``static`` is the seed's fixed-expert throughput proxy: the report
says its outputs differ by design and gives it no token-match verdict (no mismatch
warning). The roofline counts the routed experts a step reads, not all experts.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from pypto_bench import BadInputError, BenchConfig, run_bench, schema
from pypto_bench.cli import main
from pypto_bench.errors import EXIT
from pypto_bench.protocol import STATIC_MOE_NOTE
from pypto_bench.report import format_table, report_to_markdown


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory):
    from pypto_testing.minimax import make_tiny_minimax_m27

    return make_tiny_minimax_m27(
        tmp_path_factory.mktemp("moe") / "m27", weights="float32", mtp=False
    )


def _config(folder, **kw):
    values = dict(
        model_path=str(folder),
        device="cpu",
        regime="decode",
        seq=6,
        gen=6,
        batch=1,
        arms=("eager", "graph"),
        warmup=0,
        iters=1,
        dtype="float32",
        measure_bandwidth=False,
    )
    values.update(kw)
    return BenchConfig(**values)


@pytest.fixture(scope="module")
def exact_report(moe_folder):
    import torch

    torch._dynamo.reset()
    return run_bench(_config(moe_folder)).to_dict()


@pytest.fixture(scope="module")
def static_report(moe_folder):
    import torch

    torch._dynamo.reset()
    return run_bench(_config(moe_folder, moe_routing="static")).to_dict()


def test_the_graph_arm_runs_exact_moe_by_default(exact_report):
    graph = next(a for a in exact_report["arms"] if a["name"] == "graph")
    assert graph["ok"], graph["error"]
    assert graph["details"]["moe_routing"] == "exact"
    assert graph["details"]["moe_layers"] == 2
    assert graph["outputs_differ_by_design"] is None
    assert graph["token_match"]["rate"] == 1.0
    assert exact_report["config"]["moe_routing"] == "exact"
    eager = next(a for a in exact_report["arms"] if a["name"] == "eager")
    assert "moe_routing" not in eager["details"]  # the reference keeps the model's forward


def test_static_routing_differs_by_design_and_gets_no_verdict(static_report):
    jsonschema.validate(static_report, schema())
    graph = next(a for a in static_report["arms"] if a["name"] == "graph")
    assert graph["ok"], graph["error"]
    assert graph["details"]["moe_routing"] == "static"
    assert graph["outputs_differ_by_design"] == STATIC_MOE_NOTE
    assert graph["token_match"] is None
    assert not any("match eager" in w for w in graph["warnings"] + static_report["warnings"])
    assert static_report["ok"]
    table = format_table(static_report)
    assert "by design" in table
    assert "graph: outputs differ by design (--moe-routing static" in table
    assert "outputs differ by design" in report_to_markdown(static_report)


def test_the_roofline_counts_the_routed_experts_only(moe_folder, tmp_path):
    """Weights read per step = all weights - all experts + top-k experts per MoE layer."""
    from pypto_bench.bench import _fill_roofline
    from pypto_bench.loading import load_model
    from pypto_bench.measure import weight_bytes_read_per_step
    from pypto_bench.protocol import Context as _Ctx
    from pypto_bench.report import Report

    loaded = load_model(str(moe_folder), device="cpu", dtype="float32")
    cfg = _config(moe_folder, measure_bandwidth=False)
    report = Report("1.1", {}, "", [], {}, cfg.to_dict(), "decode")
    ctx = _Ctx(cfg, loaded.model, loaded.tokenizer, "cpu", None, None, [2], 0, None)
    _fill_roofline(ctx, report)
    per_expert = 3 * 256 * 192 * 4  # gate + up + down, hidden 256, intermediate 192, fp32
    all_weights = weight_bytes_read_per_step(loaded.model)
    assert report.roofline["expert_bytes"] == 2 * 8 * per_expert
    assert report.roofline["active_expert_bytes"] == 2 * 3 * per_expert  # top-3 of 8
    assert report.roofline["weight_bytes"] == all_weights - 2 * 5 * per_expert


def test_bad_moe_routing_is_a_usage_error(moe_folder, capsys):
    with pytest.raises(BadInputError, match="unknown MoE routing 'fast'"):
        _config(moe_folder, moe_routing="fast").validate()
    rc = main(["run", "--model-path", str(moe_folder), "--moe-routing", "fast"])
    assert rc == EXIT.USAGE
    assert "--moe-routing" in capsys.readouterr().err


def test_the_flag_reaches_the_config(moe_folder):
    import argparse

    from pypto_bench import add_bench_arguments, bench_config_from_args

    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    assert bench_config_from_args(parser.parse_args([])).moe_routing == "exact"
    args = parser.parse_args(["--moe-routing", "static"])
    assert bench_config_from_args(args).moe_routing == "static"
    assert json.loads(json.dumps(bench_config_from_args(args).to_dict()))["moe_routing"] == "static"


def test_an_arm_that_patches_the_model_still_interleaves(exact_report):
    # The graph arm's exact-MoE routing replaces the experts' forward while it is open;
    # each round puts the model in the state of the arm that runs (eager: as loaded).
    sched = exact_report["schedule"]
    assert sched["requested"] == sched["kind"] == "interleaved"
    assert "why" not in sched
    assert sched["order"] == [["eager", 0], ["graph", 0]]
    assert [a["ok"] for a in exact_report["arms"]] == [True, True]


@pytest.mark.slow(
    reason="two full runs (interleaved and sequential) of eager, graph and pypto+graph with "
    "the SIM grouped-GEMM kernel; the first kernel test of a run also builds PyPTO's calculator"
)
def test_a_kernel_plugin_arm_runs_one_arm_after_the_other(moe_folder):
    """pypto+graph's grouped-GEMM plug-in turns its package's switches on process-wide:
    the run falls back to the sequential schedule and says why; tokens equal eager's and
    the plug-in counts the same calls as a run asked to be sequential.

    Each run is the real ``pypto-bench run`` in a child process (pypto_testing.bench): the
    SIM kernel's and three compiled arms' memory (3 GB, kept by the allocator) leaves with
    it instead of staying in this worker for the rest of the suite (docs/testing.md)."""
    pytest.importorskip("pypto")
    from pypto_testing.bench import bench_report

    calls = {}
    for schedule in ("interleaved", "sequential"):
        report = bench_report(
            moe_folder, gen=3, seq=6, iters=2, arms=("eager", "graph", "pypto+graph"),
            extra=("--schedule", schedule),
        )  # fmt: skip
        assert report["schedule"]["kind"] == "sequential"
        assert report["schedule"]["requested"] == schedule
        arms = {a["name"]: a for a in report["arms"]}
        for name, arm in arms.items():
            assert arm["ok"], arm["error"]
            if name != "eager":
                assert arm["token_match"]["rate"] == 1.0
        fused = arms["pypto+graph"]["details"]["plugin_reports"]["moe"]["calls"]
        calls[schedule] = fused["grouped_gemm"]
        if schedule == "interleaved":
            assert "switches kernel plug-ins on (moe), process-wide" in report["schedule"]["why"]
    assert calls["interleaved"] == calls["sequential"]
    assert calls["interleaved"]["pypto"] > 0
