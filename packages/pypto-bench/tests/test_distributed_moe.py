"""--nproc 2 on a tiny Qwen3-MoE (experts sharded by transformers' moe_tp_experts plan):
prefill logits equal the single-process run within fp32 tolerance. One launch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pypto_bench.multi import run_distributed, visible_devices

sys.path.insert(0, str(Path(__file__).parent))
from _dist_fixtures import make_tiny_qwen3_moe, prefill_config, reference_logits

pytestmark = pytest.mark.skipif(visible_devices("cpu") < 2, reason="needs 2 CPU cores")


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist-moe")
    folder = make_tiny_qwen3_moe(root / "qwen3moe")
    return run_distributed(prefill_config(folder), state_dir=root / "state"), root, folder


def test_moe_prefill_logits_equal_single_process(moe_run):
    import torch
    from transformers import AutoTokenizer

    from pypto_bench.bench import make_prompt_ids

    report, root, folder = moe_run
    saved = torch.load(root / "state" / "outputs.pt")
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    ref = reference_logits(folder, make_prompt_ids(tok, 1, 8, {0, 1, 2}))
    assert (saved["distributed"] - ref).abs().max() < 1e-4
    assert report.model["model_type"] == "qwen3_moe"
    assert report.distributed["agreement"]["ok"]
    assert "Qwen3MoeConfig" in report.distributed["tp_plan"]
    # The experts are sharded too: each rank holds about half the parameters.
    full = report.model["parameters"] * 4
    assert all(r["local_parameter_bytes"] < 0.8 * full for r in report.distributed["ranks"])
