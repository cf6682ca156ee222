"""The graph arm's report says what max-autotune chose while compiling (issue #31: the
choice is timed under the same load as the measurement): a real decode run, one layer."""

from __future__ import annotations

import pytest
import torch._inductor.config as inductor_config

from pypto_bench import BenchConfig, run_bench


@pytest.mark.slow
def test_the_graph_arm_records_its_autotune_choices(tmp_path):
    from pypto_testing.models import make_tiny_model

    folder = make_tiny_model(tmp_path / "one-layer", num_hidden_layers=1)
    config = BenchConfig(
        model_path=str(folder), device="cpu", regime="decode", seq=8, gen=3,
        arms=("eager", "graph"), warmup=0, iters=1, measure_bandwidth=False,
        compile_mode="max-autotune-no-cudagraphs",
    )  # fmt: skip
    with inductor_config.patch(force_disable_caches=True):
        report = run_bench(config)
    graph = report.arm("graph")
    assert graph.ok, graph.error
    assert graph.token_match["rate"] == 1.0
    tuned = graph.details["autotune"]
    assert tuned["recorded"] is True
    assert tuned["ops"], tuned  # the projections' GEMMs were timed
    assert all(op["chosen"] in op["times_ms"] for op in tuned["ops"])
    assert "autotune" not in report.arm("eager").details
