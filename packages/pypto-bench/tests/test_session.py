"""open_session: other tools run exactly the iteration the bench times."""

from __future__ import annotations

import pytest
import torch

from pypto_bench import BadInputError, BenchConfig, measure_matmul_peak, open_session


def _cfg(path, regime="decode"):
    return BenchConfig(model_path=str(path), device="cpu", regime=regime, seq=8, gen=6)


def test_decode_iterations_of_both_arms_agree(tiny_llama):
    session = open_session(_cfg(tiny_llama))
    assert session.model_info["class"] == "LlamaForCausalLM"
    assert session.input_ids.shape == (1, 8)
    with session.iteration("eager") as once:
        eager_tokens, ttft, decode_s = once()
    with session.iteration("graph") as once:
        graph_tokens, _, _ = once()
        again, _, _ = once()  # the captured step replays: same tokens on every call
    assert session.details["backend"] == "compile"
    assert torch.equal(eager_tokens, graph_tokens)
    assert torch.equal(graph_tokens, again)
    assert ttft > 0
    assert decode_s > 0


def test_prefill_iteration_returns_logits(tiny_llama):
    session = open_session(_cfg(tiny_llama, "prefill"))
    with session.iteration("eager") as once:
        eager = once()
    with session.iteration("graph") as once:
        graph = once()
    assert eager.shape[:2] == (1, 8)
    torch.testing.assert_close(eager, graph, rtol=1e-4, atol=1e-4)


def test_bad_arm_and_bad_config(tiny_llama, tmp_path):
    session = open_session(_cfg(tiny_llama))
    with pytest.raises(BadInputError, match="unknown arm"), session.iteration("turbo"):
        pass
    with pytest.raises(BadInputError):
        open_session(BenchConfig(model_path=str(tiny_llama), device="cpu", gen=1))


def test_matmul_peak_is_measured():
    got = measure_matmul_peak("cpu", torch.float32, size=128, repeats=2)
    assert got["flops_per_s"] > 0
    assert "128x128 float32" in got["method"]
