"""bisect_capture names the stage that was broken on purpose (real torch.compile)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
models = pytest.importorskip("pypto_testing.models")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from pypto_capture import STAGES, bisect_capture  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = models.make_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama")
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


@pytest.mark.timeout(600)
def test_bisect_names_broken_attention(llama):
    attn = llama.model.layers[0].self_attn
    original = attn.forward

    def host_synced_attention(*args, **kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if hidden.abs().sum().item() > 0:  # the kind of host sync that breaks capture
            return original(*args, **kwargs)
        return original(*args, **kwargs)

    attn.forward = host_synced_attention
    try:
        result = bisect_capture(llama, backend="compile", device="cpu")
    finally:
        del attn.forward
    assert [s["stage"] for s in result.stages] == list(STAGES)
    by_stage = {s["stage"]: s for s in result.stages}
    assert by_stage["embed_norm"]["ok"] is True
    assert result.failed_stage == "attention"
    assert result.explanation.code == "graph_break"
    assert by_stage["layer"]["ok"] is False  # the layer contains the broken attention
    assert by_stage["moe"]["ok"] is None  # llama has no MoE block
    json.dumps(result.to_dict())


def test_bisect_eager_backend_passes_everything(llama):
    result = bisect_capture(llama, backend="eager", device="cpu")
    assert result.failed_stage is None
    assert [s["ok"] for s in result.stages] == [True, True, True, None]
    assert torch.is_grad_enabled()


def test_bisect_finds_and_runs_the_moe_block():
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(
        "qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        vocab_size=259, num_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
        decoder_sparse_step=1, mlp_only_layers=[],
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    result = bisect_capture(model, backend="eager", device="cpu")
    assert [s["ok"] for s in result.stages] == [True, True, True, True]
    assert result.failed_stage is None
