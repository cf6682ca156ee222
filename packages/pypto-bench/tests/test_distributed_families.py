"""--nproc 2 on the tiny family folders that have a tensor-parallel plan (native
transformers plans; unpinned folders, see the README's --nproc section): prefill logits
equal the single-process run. One launch per folder, seq 8, one iteration."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pypto_bench import BenchConfig
from pypto_bench.distributed import run_distributed, visible_devices

sys.path.insert(0, str(Path(__file__).parent))
from _dist_fixtures import reference_logits

pytestmark = pytest.mark.skipif(visible_devices("cpu") < 2, reason="needs 2 CPU cores")


def _run(folder: Path, state: Path, dtype: str = "float32"):
    config = BenchConfig(
        model_path=str(folder),
        device="cpu",
        regime="prefill",
        seq=8,
        arms=("eager",),
        warmup=0,
        iters=1,
        dtype=dtype,
        measure_bandwidth=False,
        nproc=2,
    )
    return run_distributed(config, state_dir=state)


def _saved(state: Path):
    import torch

    return torch.load(state / "outputs.pt")


def _prompt(folder: Path):
    from transformers import AutoTokenizer

    from pypto_bench.bench import make_prompt_ids

    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return make_prompt_ids(tok, 1, 8, {0, 1, 2})


def _sharded(report) -> None:
    full = report.model["parameters"] * 4  # fp32
    assert all(r["local_parameter_bytes"] < 0.8 * full for r in report.distributed["ranks"])


def test_minimax_m27_fp32_logits_equal_single_process(tmp_path):
    from pypto_testing.minimax import make_tiny_minimax_m27

    folder = make_tiny_minimax_m27(tmp_path / "m27", weights="float32")
    report = _run(folder, tmp_path / "state")
    saved = _saved(tmp_path / "state")
    ref = reference_logits(folder, _prompt(folder))
    assert (saved["distributed"] - ref).abs().max() < 1e-4
    assert report.distributed["agreement"]["ok"]
    assert "MiniMaxM2Config" in report.distributed["tp_plan"]
    _sharded(report)  # attention heads and every expert's matrices are split


def test_minimax_m27_bf16_rounding_is_not_a_disagreement(tmp_path):
    """The release's dtype: the sharded bf16 logits differ from the 1-rank bf16 ones by
    about one bf16 ulp of the largest logit (0.153 at 11.7), which the old absolute bound
    (0.05) called a disagreement; the tolerance now scales with the logits."""
    from pypto_testing.minimax import make_tiny_minimax_m27

    folder = make_tiny_minimax_m27(tmp_path / "m27", weights="bf16")
    report = _run(folder, tmp_path / "state", dtype="auto")
    agreement = report.distributed["agreement"]
    assert report.model["dtype"] == "bfloat16"
    assert agreement["max_abs_diff"] > 0.05  # the case the absolute bound refused
    assert agreement["ok"], agreement
    assert agreement["max_abs_diff"] <= agreement["atol"]
    assert "eps" in agreement["atol_rule"]
    assert agreement["token_match"]["rate"] == 1.0
    assert not any("differ from the 1-rank run" in w for w in report.warnings)


def test_gemma4_moe_two_kv_heads_logits_equal_single_process(tmp_path):
    from pypto_testing.gemma4 import make_tiny_gemma4

    folder = make_tiny_gemma4(
        tmp_path / "g4",
        "26b_a4b",
        vision=False,
        num_key_value_heads=2,
        num_global_key_value_heads=2,
    )
    report = _run(folder, tmp_path / "state")
    saved = _saved(tmp_path / "state")
    ref = reference_logits(folder, _prompt(folder))
    assert (saved["distributed"] - ref).abs().max() < 1e-4
    assert report.distributed["agreement"]["max_abs_diff"] < 1e-4
    assert "Gemma4Config" in report.distributed["tp_plan"]
    _sharded(report)
