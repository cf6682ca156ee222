"""--nproc 2 on the tiny family folders that have a tensor-parallel plan: native
transformers plans on unpinned folders, and the in-repo families' own ``pypto_tp_plan``
on folders pinned by pypto-patch (LLaDA2, MiniMax M2.7 and M3, applied by
pypto_bench.multi.tensor): prefill logits equal the single-process run, decode tokens
(eager and graph arms) equal it. One launch per folder, seq 8, one iteration."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pypto_bench import BenchConfig
from pypto_bench.multi import run_distributed, visible_devices

sys.path.insert(0, str(Path(__file__).parent))
from _dist_fixtures import prefill_config, reference_logits

pytestmark = pytest.mark.skipif(visible_devices("cpu") < 2, reason="needs 2 CPU cores")


def _run(folder: Path, state: Path, dtype: str = "float32", **kw):
    return run_distributed(prefill_config(folder, dtype=dtype, **kw), state_dir=state)


def _pinned(folder: Path, family: str) -> Path:
    """Pin with pypto-patch; the in-repo family packages are not pypto-bench test needs
    (skipped where they are not installed, e.g. nox's package(pypto-bench) session)."""
    pytest.importorskip("pypto_patch")
    packages = {"llada2": "pypto_models_llada2", "gemma4": "pypto_models_gemma4"}
    pytest.importorskip(
        next((v for k, v in packages.items() if family.startswith(k)), "pypto_models_minimax")
    )
    from pypto_patch import apply

    apply(folder, family=family)
    return folder


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
    from transformers import MiniMaxM2Config

    if any(".experts" in rule for rule in MiniMaxM2Config.base_model_tp_plan or {}):
        _sharded(report)  # attention heads and every expert's matrices are split
    else:
        # transformers 5.25 moved the experts to an expert-parallel plan
        # (base_model_ep_plan): its tensor-parallel plan splits the attention only.
        full = report.model["parameters"] * 4
        assert all(r["local_parameter_bytes"] < full for r in report.distributed["ranks"])


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


# --- in-repo families: their own plan, on pinned folders ---------------------------------


def test_llada2_pinned_prefill_logits_equal_single_process(tmp_path):
    """LLaDA2's fused q|k|v (16 q heads, 4 kv heads: parts of different widths) is cut per
    part, each rank attends with its heads, ``dense`` and the experts sum over ranks."""
    from pypto_testing.llada2 import make_tiny_llada2

    folder = _pinned(make_tiny_llada2(tmp_path / "l2"), "llada2_moe")
    report = _run(folder, tmp_path / "state", trust_remote_code=True)
    saved = _saved(tmp_path / "state")
    ref = reference_logits(folder, _prompt(folder), trust_remote_code=True)
    assert (saved["distributed"] - ref).abs().max() < 1e-4
    assert report.distributed["agreement"]["ok"]
    assert report.distributed["tp_plan"].startswith("pypto_tp_plan of LLaDA2MoeConfig")
    _sharded(report)


def test_minimax_m27_pinned_prefill_logits_equal_single_process(tmp_path):
    from pypto_testing.minimax import make_tiny_minimax_m27

    folder = _pinned(make_tiny_minimax_m27(tmp_path / "m27", weights="float32"), "minimax_m27")
    report = _run(folder, tmp_path / "state", trust_remote_code=True)
    saved = _saved(tmp_path / "state")
    ref = reference_logits(folder, _prompt(folder), trust_remote_code=True)
    assert (saved["distributed"] - ref).abs().max() < 1e-4
    assert "PyptoMiniMaxM27Config" in report.distributed["tp_plan"]
    _sharded(report)


@pytest.mark.slow(
    reason="--nproc 2 decode of the pinned MiniMax M3 folder, eager and graph arms compiled "
    "in both ranks (152 s beside a second worker, ~90 s alone)"
)
def test_minimax_m3_pinned_decode_eager_and_graph_tokens_equal(tmp_path):
    """M3 (sparse-attention indexer, shared expert): the strict pinned loader, then the
    family's plan; eager generate and the compiled decode step (collectives traced, the
    exact capture-safe MoE as in one process) both give the 1-rank tokens."""
    import torch

    from pypto_testing.minimax import make_tiny_minimax_m3

    folder = _pinned(make_tiny_minimax_m3(tmp_path / "m3", weights="float32"), "minimax_m3")
    report = _run(
        folder, tmp_path / "state", trust_remote_code=True, regime="decode", gen=6,
        arms=("eager", "graph"), ignore_eos=True,
    )  # fmt: skip
    saved = _saved(tmp_path / "state")
    for arm in ("eager", "graph"):
        pair = saved["arms"][arm]
        assert torch.equal(pair["distributed"].long(), pair["baseline"].long()), arm
        assert report.distributed["arms"][arm]["agreement"]["ok"], arm
    graph = {a.name: a for a in report.arms}["graph"]
    assert graph.details.get("moe_routing") == "exact"
    assert "PyptoMiniMaxM3Config" in report.distributed["tp_plan"]
    _sharded(report)


def test_gemma4_pinned_shards_by_the_native_plan_through_the_strict_loader(tmp_path):
    """The pinned Gemma 4 classes pass ``distributed_config`` to transformers' loader (their
    strict check runs on the sharded result) and inherit the native plan, MoE included."""
    from pypto_testing.gemma4 import make_tiny_gemma4

    folder = make_tiny_gemma4(
        tmp_path / "g4", "26b_a4b", vision=False, num_key_value_heads=2,
        num_global_key_value_heads=2,
    )  # fmt: skip
    _pinned(folder, "gemma4_26b_a4b_it")
    report = _run(folder, tmp_path / "state", trust_remote_code=True)
    assert report.distributed["agreement"]["max_abs_diff"] < 1e-4
    assert "PyptoGemma4Config26BA4B" in report.distributed["tp_plan"]
    _sharded(report)


def test_a_folder_cannot_hand_in_its_own_plan(tiny_llama, tmp_path):
    """transformers copies unknown config.json keys onto the config object: a stranger's
    ``pypto_tp_plan`` there must not be applied (only the installed class's counts)."""
    import json
    import shutil

    from pypto_bench.multi.preflight import check_tp_plan

    folder = tmp_path / "hostile"
    shutil.copytree(tiny_llama, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["pypto_tp_plan"] = {"embed_tokens": "colwise"}
    (folder / "config.json").write_text(json.dumps(cfg))
    plan = check_tp_plan(BenchConfig(model_path=str(folder), device="cpu", nproc=2))
    assert plan.startswith("transformers base_model_tp_plan")
