"""run_bench on real tiny models: regimes, arms, counting, memory, roofline, schema."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from pypto_bench import BenchConfig, RegimeNotSupportedError, run_bench, schema
from pypto_bench.report import SCHEMA_VERSION, report_to_markdown, validate_report


def test_decode_report_matches_schema_and_is_consistent(decode_report):
    report, path = decode_report
    data = json.loads(path.read_text())
    jsonschema.validate(data, schema())
    validate_report(data)
    assert data["schema_version"] == SCHEMA_VERSION == "1.6"
    assert data["regime"] == "decode"
    assert data["ok"] is True
    versions = data["environment"]["versions"]
    assert versions["torch"] == torch.__version__
    assert versions["transformers"]
    assert data["environment"]["device"]["type"] == "cpu"
    for arm in data["arms"]:
        tps = arm["tokens_per_s"]
        assert len(tps["samples"]) == 3  # same iters for every arm
        assert tps["best"] == max(tps["samples"]) > 0
        assert min(tps["samples"]) <= tps["median"] <= tps["best"]
        assert len(arm["ttft_s"]["samples"]) == 3
        assert arm["memory"]["reserved_per_iter"]
        assert "peak_allocated" in arm["memory"]
        rows = arm["details"]["tokens_per_row"]
        assert len(rows) == 2  # batch 2: counted per row, summed
        assert arm["tokens_per_iter"][-1] == sum(c - 1 for c in rows)
        roof = arm["roofline"]
        assert roof["ceiling_tok_s"] > 0
        assert roof["fraction_of_ceiling"] > 0
    graph = report.arm("graph")
    assert graph.ratio_to_eager == pytest.approx(
        graph.tokens_per_s["best"] / report.arm("eager").tokens_per_s["best"]
    )
    # What compiled it: inductor's C++ wrapper, pypto-capture's CPU default.
    assert graph.details["inductor_wrapper"] == "cpp"
    assert "inductor_wrapper" not in report.arm("eager").details
    # The graph arm checks itself against eager: exact in fp32.
    assert graph.token_match["rate"] == 1.0
    assert graph.token_match["compared"] > 0
    assert data["roofline"]["bandwidth_bytes_per_s"] > 0
    assert data["model"]["load_s"] > 0
    md = report_to_markdown(report)
    assert "| graph | ok |" in md
    assert "decode" in md


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "mistral", "gemma3"])
def test_decode_other_architectures(tiny_model_factory, arch):
    path = tiny_model_factory(arch)
    report = run_bench(
        BenchConfig(
            model_path=str(path),
            device="cpu",
            seq=6,
            gen=6,
            batch=1,
            warmup=0,
            iters=2,
            arms=("eager", "graph"),
            graph_backend="eager",
            measure_bandwidth=False,
        )
    )
    assert report.ok, [a.error for a in report.arms]
    assert report.arm("graph").token_match["rate"] == 1.0
    for arm in report.arms:
        rows = arm.details["tokens_per_row"]
        assert 1 <= rows[0] <= 6
        assert arm.tokens_per_iter == [rows[0] - 1] * 2


def test_prefill_regime(tiny_llama):
    report = run_bench(
        BenchConfig(
            model_path=str(tiny_llama),
            device="cpu",
            regime="prefill",
            seq=16,
            gen=1,
            batch=2,
            warmup=1,
            iters=2,
            arms=("eager", "graph"),
            graph_backend="compile",
        )
    )
    assert report.ok, [a.error for a in report.arms]
    for arm in report.arms:
        assert arm.tokens_per_iter == [32, 32]  # batch * seq
        assert arm.tokens_per_s["samples"][0] == pytest.approx(32 / arm.seconds["samples"][0])
        assert arm.ttft_s is None
        assert arm.roofline is None
    assert report.arm("graph").token_match["rate"] == 1.0
    assert report.roofline is None


def test_diffusion_regime(diffusion_model, tmp_path):
    out = tmp_path / "diff.json"
    report = run_bench(
        BenchConfig(
            model_path=str(diffusion_model),
            device="cpu",
            regime="diffusion-generate",
            seq=4,
            gen=8,
            batch=2,
            warmup=1,
            iters=2,
            arms=("eager", "graph"),
            graph_backend="compile",
            trust_remote_code=True,
            diffusion_steps=4,
            report_file=str(out),
        )
    )
    assert report.ok, [a.error for a in report.arms]
    for arm in report.arms:
        assert arm.tokens_per_iter == [16, 16]  # batch * gen, prompt never counted
        assert arm.details["num_denoising_steps"] == 4
    assert report.arm("graph").details["forward_used"] is True
    assert report.arm("graph").token_match["rate"] == 1.0
    jsonschema.validate(json.loads(out.read_text()), schema())


def test_diffusion_regime_refused_for_autoregressive_model(tiny_llama):
    with pytest.raises(RegimeNotSupportedError, match="no diffusion_generate"):
        run_bench(
            BenchConfig(
                model_path=str(tiny_llama), device="cpu", regime="diffusion-generate", gen=4
            )
        )


def test_tokens_counted_to_eos_with_batch(models_dir):
    """EOS early in one row: only tokens up to and including EOS count, summed over rows."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pypto_bench.bench import make_prompt_ids
    from pypto_testing.models import make_tiny_model

    path = make_tiny_model(models_dir / "eos", "llama", seed=5)
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    ids = make_prompt_ids(tok, 2, 8, {0, 1, 2})
    with torch.inference_mode():
        free = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=10,
            min_new_tokens=10,
            pad_token_id=0,
        )[:, 8:]
    # Make the 3rd token of row 0 the EOS; row 1 stops wherever that token first appears.
    eos = int(free[0, 2])
    expected = []
    for row in free.tolist():
        expected.append(row.index(eos) + 1 if eos in row else len(row))
    assert expected[0] <= 3
    model.generation_config.eos_token_id = eos
    model.config.eos_token_id = eos
    model.save_pretrained(str(path), safe_serialization=True)
    report = run_bench(
        BenchConfig(
            model_path=str(path),
            device="cpu",
            seq=8,
            gen=10,
            batch=2,
            warmup=0,
            iters=1,
            arms=("eager", "graph"),
            graph_backend="eager",
            measure_bandwidth=False,
        )
    )
    assert report.ok, [a.error for a in report.arms]
    for arm in report.arms:
        assert arm.details["tokens_per_row"] == expected
        assert arm.tokens_per_iter == [sum(c - 1 for c in expected)]
    assert report.arm("graph").token_match["rate"] == 1.0
