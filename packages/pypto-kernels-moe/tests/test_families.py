"""The pypto+graph arm on the tiny family folders (MiniMax M3, Gemma 4 26B-A4B, LLaDA2),
fp32: greedy tokens equal eager's and every MoE call of every replay ran the PyPTO kernel.

Kept as cheap as the proof allows (the suite's time budget): one MoE layer per model (two for M3, its
smallest sparse-attention layout),
a 4-token prompt, two decode steps (eight diffusion steps for LLaDA2's one block),
warmup 0, one iteration, one bench run per family shared by its assertions. MiniMax
M2.7's SiLU experts are the same kernel as LLaDA2's and Qwen3-MoE's (test_plugin.py);
M3 covers MiniMax's clamped ``swigluoai`` variant.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pypto_patch")
pytest.importorskip("pypto_bench")

FAMILIES = {
    # family preset: (builder module, builder, kwargs, regime, expected activation, gen)
    "minimax_m3": (
        "pypto_testing.minimax",
        "make_tiny_minimax_m3",
        {"weights": "float32"},  # its smallest: 3 layers, 2 MoE (sparse-attention layout)
        "decode",
        "swigluoai",
        2,
    ),
    "gemma4_26b_a4b_it": (
        "pypto_testing.gemma4",
        "make_tiny_gemma4",
        {"variant": "26b_a4b", "pattern": ["full_attention"]},
        "decode",
        "gelu_tanh",
        2,
    ),
    "llada2_moe": (
        "pypto_testing.llada2",
        "make_tiny_llada2",
        {"num_hidden_layers": 2, "first_k_dense_replace": 1},
        "diffusion-generate",
        "silu",
        8,
    ),
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_run(request, tmp_path_factory):
    """One bench run (eager, pypto+graph) per family, shared by the tests. The plain graph
    arm of each family folder is proven by the family's own tests (pypto-models-gemma4's
    test_decode 26b-a4b MoE, pypto-models-minimax's test_parity M3 pair, pypto-bench's
    LLaDA2 diffusion regime): here it would be one more inductor compile per family that
    proves nothing about the kernel (the suite's budget, issue #40)."""
    pytest.importorskip("pypto")
    family = request.param
    pytest.importorskip(f"pypto_models_{family.split('_')[0]}")
    import importlib

    from transformers import AutoModelForCausalLM

    from pypto_kernels_moe import PACKAGE, fitting_experts
    from pypto_patch import apply
    from pypto_testing.bench import fused_arm_run

    module, builder, kwargs, regime, _, gen = FAMILIES[family]
    folder = tmp_path_factory.mktemp(family) / "model"
    getattr(importlib.import_module(module), builder)(folder, **kwargs)
    apply(folder, family=family)
    model = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True)
    acts = [a for _, _, a in fitting_experts(model)]
    del model
    PACKAGE.stats.reset()
    arms = fused_arm_run(
        folder, gen=gen, regime=regime, arms=("eager", "pypto+graph"), trust_remote_code=True
    )
    return family, acts, arms


def test_the_family_experts_fit_the_kernel(family_run):
    family, acts, _ = family_run
    assert acts, "no fused experts the kernel can run"
    assert {a[0] for a in acts} == {FAMILIES[family][4]}, acts


def test_every_arm_ran_and_tokens_equal_eager(family_run):
    _, _, arms = family_run
    for name in ("eager", "pypto+graph"):
        assert arms[name]["ok"], arms[name].get("error")
    assert arms["pypto+graph"]["token_match"]["rate"] == 1.0, arms["pypto+graph"]["token_match"]
    # Logits, not only tokens: the numerical gate's verdict against eager (issue #42).
    numerics = arms["pypto+graph"].get("numerics") or {}
    assert numerics.get("verdict") == "pass", numerics


def test_the_kernel_ran_on_every_replay_without_fallback(family_run):
    family, acts, arms = family_run
    fused = arms["pypto+graph"]
    calls = fused["details"]["plugin_reports"]["moe"]["calls"]["grouped_gemm"]
    assert calls["reference"] == 0, json.dumps(fused["details"])
    # every generated step runs every MoE layer through the kernel: a kernel that ran
    # only while capturing would count fewer
    assert calls["pypto"] >= FAMILIES[family][5] * len(acts), calls
