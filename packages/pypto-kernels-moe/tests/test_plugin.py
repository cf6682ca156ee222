"""The pypto.kernels plug-in on a real tiny Qwen3-MoE folder, and the bench's pypto+graph arm."""

from __future__ import annotations

import importlib.metadata
import json

import pytest
import torch

from pypto_kernels_moe import PACKAGE, PLUGIN, fitting_experts

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def qwen3_moe_folder(tmp_path_factory):
    """A loadable Qwen3-MoE folder (pypto_testing has no qwen3_moe builder; the same
    recipe as its make_tiny_model: byte tokenizer, seeded weights, safetensors)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pypto_testing.models import SPECIAL_TOKENS, write_byte_tokenizer

    path = tmp_path_factory.mktemp("qwen3moe") / "model"
    path.mkdir()
    write_byte_tokenizer(path)
    config = AutoConfig.for_model(
        "qwen3_moe",
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        vocab_size=len(SPECIAL_TOKENS) + 256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        architectures=["Qwen3MoeForCausalLM"],
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = 0
    model.save_pretrained(str(path), safe_serialization=True)
    return path


@pytest.fixture
def qwen3_moe(qwen3_moe_folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(qwen3_moe_folder)).eval()


def test_entry_point_names_the_plugin():
    eps = importlib.metadata.entry_points(group="pypto.kernels")
    assert any(ep.name == "moe" and ep.load() is PLUGIN for ep in eps)


def test_applies_to_fused_experts_only(qwen3_moe, qwen3_moe_folder, tmp_path):
    from pypto_testing.models import make_tiny_model

    assert PLUGIN.applies_to(qwen3_moe)
    assert len(fitting_experts(qwen3_moe)) == 2
    from transformers import AutoModelForCausalLM

    dense = AutoModelForCausalLM.from_pretrained(str(make_tiny_model(tmp_path / "llama")))
    assert not PLUGIN.applies_to(dense)
    with pytest.raises(ValueError, match="no fused gated experts"), PLUGIN.enable(dense):
        pass


def test_enable_routes_experts_through_the_op_and_exit_restores(qwen3_moe):
    ids = torch.tensor([[5, 9, 14, 20]])
    experts = [m for _, m, _ in fitting_experts(qwen3_moe)]
    with torch.no_grad():
        want = qwen3_moe(ids).logits
        with PLUGIN.enable(qwen3_moe):
            assert PACKAGE.switches.is_on("grouped_gemm")
            assert all("forward" in vars(m) for m in experts)
            PACKAGE.switches.set_switch("grouped_gemm", False)  # counted reference path
            got = qwen3_moe(ids).logits
            PACKAGE.switches.set_switch("grouped_gemm", True)
    assert not PACKAGE.switches.is_on("grouped_gemm")
    assert all("forward" not in vars(m) for m in experts)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert PLUGIN.report()["calls"]["grouped_gemm"]["reference"] == 2  # one per MoE layer


def test_enable_wraps_the_exact_moe_forward_and_restores_it(qwen3_moe):
    from pypto_capture import apply_exact_moe

    with apply_exact_moe(qwen3_moe):
        experts = [m for _, m, _ in fitting_experts(qwen3_moe)]
        exact = [vars(m)["forward"] for m in experts]
        with PLUGIN.enable(qwen3_moe):
            assert all(vars(m)["forward"] is not f for m, f in zip(experts, exact, strict=True))
        assert all(vars(m)["forward"] is f for m, f in zip(experts, exact, strict=True))


def _bench(folder, gen, arms):
    from pypto_testing.bench import fused_arm_run

    ran = fused_arm_run(folder, gen=gen, arms=arms)
    for name in arms:
        assert ran[name]["ok"], ran[name].get("error")
    return ran["pypto+graph"]


@pytest.mark.slow(
    reason="the real pypto-bench run of graph and pypto+graph with the SIM grouped-GEMM "
    "kernel in every replay (155 s beside a second worker, ~90 s alone)"
)
def test_bench_pypto_graph_arm_runs_the_kernel_on_every_replay(qwen3_moe_folder):
    """eager, graph, pypto+graph on the tiny Qwen3-MoE: tokens equal eager (fp32), no
    fallback, and the kernel count grows with the decode steps (2 MoE layers per step):
    it runs on every replay of the captured step, not once at capture."""
    pytest.importorskip("pypto")
    counts = {}
    # The plain graph arm once, in the longer run (the shorter one only counts the kernel).
    for gen, arms in ((2, ("eager", "pypto+graph")), (4, ("eager", "graph", "pypto+graph"))):
        fused = _bench(qwen3_moe_folder, gen, arms)
        assert fused["details"]["moe_routing"] == "exact"
        assert fused["details"]["plugins"] == ["moe"] or "moe" in fused["details"]["plugins"]
        calls = fused["details"]["plugin_reports"]["moe"]["calls"]["grouped_gemm"]
        assert calls["reference"] == 0, json.dumps(fused["details"])
        assert fused["token_match"]["rate"] == 1.0, fused["token_match"]
        assert fused["token_match"]["compared"] == gen
        counts[gen] = calls["pypto"]
    assert counts[4] - counts[2] >= 2 * 2, counts
