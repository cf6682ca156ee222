"""bisect_capture names the stage that was broken on purpose (real torch.compile)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
models = pytest.importorskip("pypto_testing.models")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from pypto_capture import STAGES, UnsupportedModelError, bisect_capture  # noqa: E402


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


def _moe_model(experts_implementation, mlp_layer_types=None):
    from transformers import AutoConfig

    extra = {}
    if mlp_layer_types is not None:  # MiniMax M3: dense first layers, then MoE
        extra = dict(
            dense_intermediate_size=64,
            shared_intermediate_size=32,
            mlp_layer_types=mlp_layer_types,
            layer_types=["full_attention"] * len(mlp_layer_types),
            index_head_dim=16,
        )
    cfg = AutoConfig.for_model(
        "minimax_m3_vl_text" if mlp_layer_types else "minimax_m2",
        hidden_size=64, intermediate_size=32, num_hidden_layers=len(mlp_layer_types or [0]),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=259,
        num_local_experts=4, num_experts_per_tok=2, rotary_dim=8, max_position_embeddings=128,
        **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(
        cfg, attn_implementation="eager", experts_implementation=experts_implementation
    ).eval()


@pytest.mark.timeout(600)
def test_bisect_moe_stage_explains_routing_and_proves_the_exact_fix():
    """transformers' data-dependent experts loop fails the compile backend's capture; the
    MoE stage says why (routing) and that apply_exact_moe captures the same block."""
    model = _moe_model("eager")
    experts = model.model.layers[0].mlp.experts
    result = bisect_capture(model, backend="compile", device="cpu")
    moe = next(s for s in result.stages if s["stage"] == "moe")
    assert moe["ok"] is False
    assert "apply_exact_moe" in moe["explanation"].fix
    assert "experts loop" in moe["explanation"].cause
    assert moe["exact_moe"] == {
        "ok": True,
        "error": None,
        "fix": "pypto_capture.apply_exact_moe(model)",
    }
    assert "forward" not in vars(experts)  # the block is restored afterwards
    json.dumps(result.to_dict())


def test_bisect_finds_the_moe_block_behind_dense_layers():
    pytest.importorskip(
        "transformers.models.minimax_m3_vl", reason="MiniMax M3 needs transformers>=5.12"
    )
    model = _moe_model("grouped_mm", mlp_layer_types=["dense", "sparse"])
    result = bisect_capture(model, backend="eager", device="cpu")
    moe = next(s for s in result.stages if s["stage"] == "moe")
    assert moe["ok"] is True  # found in layer 1 (layer 0 is dense), not "not present"


# --- any decoder: blocks found by structure, not by attribute names ---------------------

architectures = pytest.importorskip("pypto_testing.architectures")

# model type -> the stages bisect must find: (module path, class). None: not in the model.
EXPECTED_BLOCKS = {
    "falcon_h1": {  # attention and Mamba2 in parallel in every layer; final_layernorm
        "embed_norm": ("final_layernorm", "FalconH1RMSNorm"),
        "attention": ("layers.0.self_attn", "FalconH1Attention"),
        "mixer": ("layers.0.mamba", "FalconH1Mixer"),
        "layer": ("layers.0", "FalconH1DecoderLayer"),
        "moe": None,
    },
    "mamba2": {  # no attention at all; norm_f; the mixer is called `mixer`
        "embed_norm": ("norm_f", "Mamba2RMSNorm"),
        "attention": None,
        "mixer": ("layers.0.mixer", "Mamba2Mixer"),
        "layer": ("layers.0", "Mamba2Block"),
        "moe": None,
    },
    "qwen3_next": {  # Gated DeltaNet first, full attention in layer 1, MoE
        "embed_norm": ("norm", "Qwen3NextRMSNorm"),
        "attention": ("layers.1.self_attn", "Qwen3NextAttention"),
        "mixer": ("layers.0.linear_attn", "Qwen3NextGatedDeltaNet"),
        "layer": ("layers.0", "Qwen3NextDecoderLayer"),
        "moe": ("layers.1.mlp", "Qwen3NextSparseMoeBlock"),
    },
}


def _tiny(tmp_path, model_type):
    why = architectures.available(model_type)
    if why:
        pytest.skip(why)
    path = architectures.make_tiny_architecture(tmp_path / model_type, model_type)
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


@pytest.mark.parametrize("model_type", sorted(EXPECTED_BLOCKS))
def test_bisect_finds_every_block_of_a_recurrent_or_hybrid_decoder(tmp_path, model_type):
    """Each stage is found and runs its decode-shaped call (eager: the structure and the
    inputs are under test here; the compile test below captures)."""
    model = _tiny(tmp_path, model_type)
    result = bisect_capture(model, backend="eager", device="cpu")
    by_stage = {s["stage"]: s for s in result.stages}
    assert [s["stage"] for s in result.stages] == [
        "embed_norm", "attention", "mixer", "layer", "moe"
    ]  # fmt: skip
    for stage, want in EXPECTED_BLOCKS[model_type].items():
        entry = by_stage[stage]
        if want is None:
            assert (entry["ok"], entry["error"]) == (None, "not present in this model"), entry
        else:
            assert (entry["module"], entry["class"]) == want, entry
            assert entry["ok"] is True, entry
    assert result.failed_stage is None
    json.dumps(result.to_dict())


@pytest.mark.timeout(600)
def test_bisect_names_a_broken_recurrent_mixer(tmp_path):
    """Real torch.compile on Mamba2: the other stages capture, the mixer stage fails."""
    model = _tiny(tmp_path, "mamba2")
    mixer = model.backbone.layers[0].mixer
    original = mixer.forward

    def host_synced_mixer(hidden_states, *args, **kwargs):
        if hidden_states.abs().sum().item() > 0:  # a host sync inside the recurrent mixer
            return original(hidden_states, *args, **kwargs)
        return original(hidden_states, *args, **kwargs)

    mixer.forward = host_synced_mixer
    try:
        result = bisect_capture(model, backend="compile", device="cpu")
    finally:
        del mixer.forward
    by_stage = {s["stage"]: s for s in result.stages}
    assert by_stage["embed_norm"]["ok"] is True
    assert result.failed_stage == "mixer"
    assert by_stage["mixer"]["class"] == "Mamba2Mixer"
    assert result.explanation.code == "graph_break"
    assert by_stage["layer"]["ok"] is False  # the layer holds the broken mixer
    json.dumps(result.to_dict())


def test_bisect_without_a_layer_list_says_what_it_needs(tmp_path):
    path = models.make_tiny_model(tmp_path / "llama", "llama")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    model.model.layers = torch.nn.Sequential(*model.model.layers)  # no ModuleList any more
    with pytest.raises(UnsupportedModelError) as exc:
        bisect_capture(model, backend="eager", device="cpu")
    message = str(exc.value)
    assert message.startswith(
        "bisect needs the decoder's layer list: no nn.ModuleList of repeated blocks under "
        "LlamaModel; found children: embed_tokens (Embedding), layers (Sequential)"
    )
    assert "\n" not in message


def test_a_spent_budget_starts_no_further_stage(llama):
    """What runs after a failed arm is bounded (issue #44): once ``budget_s`` has gone, no
    stage starts; each one left says why, and none is called failed."""
    from pypto_capture import bisect_capture

    result = bisect_capture(llama, backend="eager", budget_s=1e-9)
    assert result.failed_stage is None
    assert [s["ok"] for s in result.stages] == [None] * len(result.stages)
    present = [s for s in result.stages if s["module"]]
    assert [s["stage"] for s in present] == ["embed_norm", "attention", "layer"]
    assert all("budget was spent" in s["error"] for s in present), present
    assert result.stages[-1]["error"] == "not present in this model"  # llama has no MoE
    for bad in (0, -1, float("nan"), "300"):
        with pytest.raises(ValueError, match="budget_s"):
            bisect_capture(llama, backend="eager", budget_s=bad)
