"""--nproc 2 decode, eager arm (generate on the sharded Llama) and graph arm (the captured
decode step, torch.compile tracing the TP all-reduces under gloo): greedy tokens equal the
single-process generate. One launch for both arms."""

from __future__ import annotations

import pytest

from pypto_bench import BenchConfig
from pypto_bench.multi import run_distributed, visible_devices

pytestmark = pytest.mark.skipif(visible_devices("cpu") < 2, reason="needs 2 CPU cores")


@pytest.fixture(scope="module")
def decode_run(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("dist-decode")
    config = BenchConfig(
        model_path=str(tiny_llama),
        device="cpu",
        regime="decode",
        seq=8,
        gen=6,
        arms=("eager", "graph"),
        warmup=0,
        iters=2,
        dtype="float32",
        ignore_eos=True,
        measure_bandwidth=False,
        nproc=2,
    )
    return run_distributed(config, state_dir=root / "state"), root


def test_decode_tokens_equal_single_process(decode_run, tiny_llama):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pypto_bench.bench import make_prompt_ids

    report, root = decode_run
    saved = torch.load(root / "state" / "outputs.pt")
    tok = AutoTokenizer.from_pretrained(str(tiny_llama), local_files_only=True)
    ids = make_prompt_ids(tok, 1, 8, {0, 1, 2})
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama), local_files_only=True)
    with torch.inference_mode():
        ref = model.generate(
            input_ids=ids, do_sample=False, max_new_tokens=6, min_new_tokens=6, pad_token_id=0
        )[:, 8:]
    assert torch.equal(saved["distributed"].long(), ref)
    assert report.distributed["agreement"]["token_match"]["rate"] == 1.0
    arm = report.arms[0]
    assert arm.ttft_s["samples"]
    assert arm.tokens_per_iter == [5, 5]
    assert report.distributed["aggregate_tokens_per_s"]["best"] > 0


def test_every_sharded_arm_is_judged_against_the_1_rank_eager_logits(decode_run):
    """Issue #42's gate across ranks: eager and graph, each teacher-forced with the 1-rank
    run's tokens, within fp32's KL allowance of its logits (they compute the model)."""
    from pypto_bench.multi.arms import TP_NUMERICS_BASIS

    report, _ = decode_run
    assert [a.name for a in report.arms] == ["eager", "graph"]
    for arm in report.arms:
        num = arm.numerics or {}
        assert num.get("verdict") == "pass", (arm.name, num)
        assert num["against"] == TP_NUMERICS_BASIS
        assert num["metrics"]["kl_max"] <= 1e-9
        assert num["metrics"]["top1_agreement"] == 1.0
    assert report.numerics_failed == []
    assert report.distributed["speedup"] is not None


def test_graph_decode_tokens_equal_single_process(decode_run, tiny_llama):
    """The graph arm across ranks (it was refused): dynamo traces the sharded model's
    all-reduces into one graph; inductor runs it without freezing (which cannot fold the
    process group the collectives take). Its tokens equal the 1-process eager ones."""
    import torch

    report, root = decode_run
    saved = torch.load(root / "state" / "outputs.pt")
    graph = saved["arms"]["graph"]
    assert torch.equal(graph["distributed"].long(), saved["distributed"].long())
    assert torch.equal(graph["baseline"].long(), saved["baseline"].long())
    arms = {a.name: a for a in report.arms}
    assert arms["graph"].ok
    assert arms["graph"].details["backend"] == "compile"
    assert arms["graph"].token_match["rate"] == 1.0
    dist = report.distributed["arms"]["graph"]
    assert dist["agreement"]["ok"]
    assert dist["capture"]["freezing"] is False
    assert dist["aggregate_tokens_per_s"]["best"] > 0
    assert dist["scaling_efficiency"] is not None
    ranks = report.distributed["ranks"]
    assert all(r["arms"]["graph"]["samples_s"] for r in ranks)
    # not profiled on CPU (the profiler over compiled gloo collectives can crash a rank)
    for r in ranks:
        comm = r["arms"]["graph"]["communication"]
        assert comm["share"] is None
        assert "SIGSEGV" in comm["unmeasured"]
    assert dist["communication_share"]["median"] is None
    # the eager arm's is measured
    assert all(0 < r["communication"]["share"] < 1 for r in ranks)


def _two_cuda_devices() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.mark.cuda
@pytest.mark.skipif(not _two_cuda_devices(), reason="needs 2 CUDA GPUs (none or one visible)")
def test_graph_arm_captures_nccl_collectives_on_two_gpus(tiny_llama, tmp_path):
    """The decode step captured in a CUDA graph per rank with its NCCL collectives inside,
    replayed in lockstep: greedy tokens equal the 1-rank run's."""
    config = BenchConfig(
        model_path=str(tiny_llama), device="cuda", regime="decode", arms=("eager", "graph"),
        nproc=2, seq=4, gen=3, warmup=1, iters=1, dtype="float32", measure_bandwidth=False,
    )  # fmt: skip
    report = run_distributed(config, state_dir=tmp_path / "state")
    graph = report.distributed["arms"]["graph"]
    assert graph["capture"]["backend"].startswith("cudagraph")
    assert graph["agreement"]["token_match"]["rate"] == 1.0


def test_the_ranks_interleave_their_arms(decode_run):
    """Every rank runs the arms' timed iterations in the same balanced rounds (each one
    collective step): the report's schedule is rank 0's, and each rank has a sample of
    every arm per round, so the paired ratio to eager compares adjacent collective steps."""
    report, _ = decode_run
    sched = report.schedule
    assert sched["kind"] == sched["requested"] == "interleaved"
    assert sched["order"] == [["eager", 0], ["graph", 0], ["graph", 1], ["eager", 1]]
    for rank in report.distributed["ranks"]:
        assert len(rank["samples_s"]) == 2
        assert len(rank["arms"]["graph"]["samples_s"]) == 2
    ratio = next(a for a in report.arms if a.name == "graph").ratio_vs_eager
    assert ratio["rounds"] == 2
    assert ratio["low"] <= ratio["median"] <= ratio["high"]
