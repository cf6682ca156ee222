"""--nproc 2 decode, eager arm (generate on the sharded Llama): greedy tokens equal the
single-process generate. One launch."""

from __future__ import annotations

import pytest

from pypto_bench import BenchConfig
from pypto_bench.distributed import run_distributed, visible_devices

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
        arms=("eager",),
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
