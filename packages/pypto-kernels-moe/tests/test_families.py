"""The pypto+graph arm on the tiny family folders (MiniMax M2.7 / M3, Gemma 4 26B-A4B,
LLaDA2), fp32:
greedy tokens equal eager's and every MoE call ran the PyPTO kernel."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pypto_patch")
pytest.importorskip("pypto_bench")

FAMILIES = {
    # family preset: (builder module, builder, kwargs, regime, expected activation)
    "minimax_m27": (
        "pypto_testing.minimax",
        "make_tiny_minimax_m27",
        {"weights": "float32"},
        "decode",
        "silu",
    ),
    "minimax_m3": (
        "pypto_testing.minimax",
        "make_tiny_minimax_m3",
        {"weights": "float32"},
        "decode",
        "swigluoai",
    ),
    "gemma4_26b_a4b_it": (
        "pypto_testing.gemma4",
        "make_tiny_gemma4",
        {"variant": "26b_a4b"},
        "decode",
        "gelu_tanh",
    ),
    "llada2_moe": ("pypto_testing.llada2", "make_tiny_llada2", {}, "diffusion-generate", "silu"),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_pypto_graph_arm_on_family_folder(family, tmp_path):
    pytest.importorskip("pypto")
    pytest.importorskip(f"pypto_models_{family.split('_')[0]}")
    import importlib

    from pypto_bench import BenchConfig, run_bench
    from pypto_patch import apply

    module, builder, kwargs, regime, act = FAMILIES[family]
    folder = getattr(importlib.import_module(module), builder)(tmp_path / "model", **kwargs)
    apply(folder, family=family)

    from transformers import AutoModelForCausalLM

    from pypto_kernels_moe import fitting_experts

    model = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True)
    acts = {a[0] for _, _, a in fitting_experts(model)}
    assert acts == {act}, acts
    del model

    gen = 8 if regime == "diffusion-generate" else 3
    report = run_bench(
        BenchConfig(
            model_path=str(folder),
            device="cpu",
            regime=regime,
            seq=4,
            gen=gen,
            warmup=0,
            iters=1,
            dtype="float32",
            arms=("eager", "graph", "pypto+graph"),
            trust_remote_code=True,
            measure_bandwidth=False,
        )
    )
    arms = {a["name"]: a for a in report.to_dict()["arms"]}
    for name in ("eager", "graph", "pypto+graph"):
        assert arms[name]["ok"], arms[name].get("error")
    fused = arms["pypto+graph"]
    calls = fused["details"]["plugin_reports"]["moe"]["calls"]["grouped_gemm"]
    assert calls["reference"] == 0, json.dumps(fused["details"])
    assert calls["pypto"] > 0
    assert fused["token_match"]["rate"] == 1.0, fused["token_match"]
