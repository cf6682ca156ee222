"""--placement pipeline: the fallback for a family without a tensor-parallel plan. The
device map is computed for N accelerators without one (it is data); the run itself goes
through on a CPU, where every stage is the one CPU (the mechanics, the agreement with the
1-device run and the report; nothing is placed elsewhere)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

from pypto_bench import BadInputError, BenchConfig, schema
from pypto_bench.cli import main
from pypto_bench.errors import EXIT
from pypto_bench.multi.pipeline import stage_device_map
from pypto_bench.report import format_table

sys.path.insert(0, str(Path(__file__).parent))
from _dist_fixtures import make_tiny_gpt2


def _meta(model_type: str, **cfg):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=64, **cfg)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _llama(**kw):
    return _meta(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, **kw,
    )  # fmt: skip


def test_layers_split_into_contiguous_stages_around_the_embeddings_and_head():
    mapping, stages = stage_device_map(_llama(tie_word_embeddings=False), 2, "cuda")
    assert [mapping[f"model.layers.{i}"] for i in range(4)] == [
        "cuda:0",
        "cuda:0",
        "cuda:1",
        "cuda:1",
    ]
    assert mapping["model.embed_tokens"] == "cuda:0"  # registered before the layers
    assert mapping["model.rotary_emb"] == "cuda:0"  # weightless: feeds the first layer
    assert mapping["model.norm"] == "cuda:1"
    assert mapping["lm_head"] == "cuda:1"
    assert [s["layers"] for s in stages] == [
        ["model.layers.0", "model.layers.1"],
        ["model.layers.2", "model.layers.3"],
    ]
    assert stages[0]["layer_bytes"] == stages[1]["layer_bytes"] > 0


def test_a_tied_head_stays_with_the_input_embeddings():
    mapping, _ = stage_device_map(_llama(tie_word_embeddings=True), 2, "npu")
    assert mapping["lm_head"] == mapping["model.embed_tokens"] == "npu:0"
    assert mapping["model.norm"] == "npu:1"


def test_every_stage_gets_a_layer_and_too_few_layers_are_refused():
    _, stages = stage_device_map(_llama(tie_word_embeddings=False), 4, "cuda")
    assert [s["layer_count"] for s in stages] == [1, 1, 1, 1]
    with pytest.raises(BadInputError, match="needs at least 5 decoder layers, the model has 4"):
        stage_device_map(_llama(), 5, "cuda")


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"regime": "decode"}, "prefill regime only"),
        ({"arms": ("eager", "graph")}, "eager arm only"),
        ({"nproc": 1}, "--nproc N >= 2"),
        ({"placement": "ring"}, "unknown --placement 'ring'"),
    ],
)
def test_what_pipeline_placement_does_not_measure_is_refused(kw, words):
    values = {"model_path": "/m", "device": "cpu", "regime": "prefill", "arms": ("eager",),
              "nproc": 2, "placement": "pipeline", **kw}  # fmt: skip
    with pytest.raises(BadInputError, match=words):
        BenchConfig(**values).validate()


def test_a_model_without_a_plan_runs_pipelined_and_agrees(tmp_path, capsys):
    """GPT-2 has no tensor-parallel plan: --nproc 2 refuses it naming this fallback; with
    --placement pipeline its prefill runs over a device map and equals the 1-device run."""
    folder = make_tiny_gpt2(tmp_path / "gpt2")
    out = tmp_path / "r.json"
    argv = ["run", "--model-path", str(folder), "--device", "cpu", "--regime", "prefill",
            "--seq", "8", "--arms", "eager", "--warmup", "0", "--iters", "2", "--dtype",
            "float32", "--no-bandwidth", "--nproc", "2"]  # fmt: skip
    assert main(argv) == EXIT.USAGE
    assert "--placement pipeline" in capsys.readouterr().err
    assert main([*argv, "--placement", "pipeline", "--report-file", str(out)]) == 0
    data = json.loads(out.read_text())
    jsonschema.validate(data, schema())
    dist = data["distributed"]
    assert dist["placement"] == "pipeline"
    assert dist["backend"] is None
    assert dist["agreement"]["ok"]
    assert dist["agreement"]["max_abs_diff"] < 1e-5
    # the numerical gate: the placed arm's logits against the 1-device eager run's
    num = data["arms"][0]["numerics"]
    assert num["verdict"] == "pass", num
    assert num["metrics"]["kl_max"] <= 1e-9
    assert dist["scaling_efficiency"] is None
    assert set(dist["device_map"]) >= {
        "transformer.h.0",
        "transformer.h.1",
        "transformer.wte",
        "lm_head",
    }
    assert [r["layers"] for r in dist["ranks"]] == [
        ["transformer.h.0"] * 2,
        ["transformer.h.1"] * 2,
    ]
    assert data["config"]["placement"] == "pipeline"
    assert any("every stage is the one CPU" in w for w in data["warnings"])
    table = format_table(data)
    assert "2 pipeline stages" in table
    assert "stage 1: cpu, 1 layer(s) transformer.h.1" in table


def _two_gpus() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.mark.cuda
@pytest.mark.skipif(not _two_gpus(), reason="needs 2 CUDA GPUs (none or one visible)")
def test_pipeline_over_two_gpus(tmp_path):
    from pypto_bench import run_bench

    folder = make_tiny_gpt2(tmp_path / "gpt2")
    report = run_bench(BenchConfig(
        model_path=str(folder), device="cuda", regime="prefill", seq=8, arms=("eager",),
        warmup=0, iters=1, dtype="float32", measure_bandwidth=False, nproc=2, placement="pipeline",
    ))  # fmt: skip
    dist = report.distributed
    assert {r["device"] for r in dist["ranks"]} == {"cuda:0", "cuda:1"}
    assert dist["agreement"]["ok"]
