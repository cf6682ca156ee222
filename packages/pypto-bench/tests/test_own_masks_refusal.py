"""The graph arm of a model that builds its masks in its own code is refused in one line
whose head is the refusal itself (issue #44): the explanation clips a long message with
"...", and a clipped copy of the same error must not be shown again as an "underlying"
one in brackets."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
zoo = pytest.importorskip("pypto_testing.zoo")

from pypto_bench import BenchConfig, run_bench  # noqa: E402


def test_prophetnet_graph_decode_is_refused_with_one_plain_line(tmp_path):
    path = zoo.make_zoo_model(tmp_path / "prophetnet", "prophetnet")
    report = run_bench(
        BenchConfig(
            model_path=str(path), device="cpu", regime="decode", arms=("eager", "graph"),
            seq=8, gen=8, warmup=0, iters=1, measure_bandwidth=False, graph_backend="eager",
        )
    )  # fmt: skip
    eager, graph = report.arms
    assert eager.ok
    assert not graph.ok
    assert graph.error.startswith(
        "UnsupportedModelError: ProphetNetForCausalLM builds its attention masks"
    ), graph.error
    assert "[" not in graph.error.split(":", 1)[0]
    assert len(graph.explanation["cause_message"]) < len(graph.error)  # it was clipped
    assert "\n" not in graph.error
