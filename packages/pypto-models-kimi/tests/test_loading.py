"""Loading the published format strictly: every tensor used once, hostile folders refused
in one line with nothing written."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearForCausalLM

from pypto_models_kimi import KimiConfigError, KimiWeightsError
from pypto_models_kimi.loading import target_of
from pypto_models_kimi.modeling import PyptoKimiLinearForCausalLM
from pypto_testing.checkpoints import index_of, other_shard, poison, rewrite_shard, shard_of
from pypto_testing.kimi import read_checkpoint


def test_every_checkpoint_tensor_is_used_exactly_once(kimi):
    folder, _ = kimi
    raw = read_checkpoint(folder)
    model = PyptoKimiLinearForCausalLM.from_pretrained(folder, dtype="float32")
    report = model.pypto_load_report
    assert report.tensors == len(raw)
    assert report.shards == 2
    assert report.merged == {"conv1d": 3, "experts": 8}  # 3 KDA layers; 4 MoE layers x 2
    # each native parameter is what its published tensors say, nothing else
    layer = model.model.layers
    assert torch.equal(
        layer[0].self_attn.conv1d.weight,
        torch.cat([raw[f"model.layers.0.self_attn.{p}_conv1d.weight"] for p in "qkv"]).float(),
    )
    assert torch.equal(layer[1].self_attn.forget_gate.A_log, raw["model.layers.1.self_attn.A_log"])
    w1 = raw["model.layers.2.block_sparse_moe.experts.5.w1.weight"]
    w3 = raw["model.layers.2.block_sparse_moe.experts.5.w3.weight"]
    assert torch.equal(layer[2].mlp.experts.gate_up_proj[5], torch.cat([w1, w3]).float())
    assert torch.equal(
        layer[2].mlp.experts.down_proj[7],
        raw["model.layers.2.block_sparse_moe.experts.7.w2.weight"].float(),
    )
    assert torch.equal(
        layer[4].mlp.gate.e_score_correction_bias,
        raw["model.layers.4.block_sparse_moe.gate.e_score_correction_bias"].float(),
    )
    assert torch.equal(
        layer[2].self_attn.kv_b_proj.weight,
        raw["model.layers.2.self_attn.kv_b_proj.weight"].float(),
    )
    assert torch.equal(
        layer[0].mlp.gate_proj.weight, raw["model.layers.0.mlp.gate_proj.weight"].float()
    )


def test_the_mapping_is_transformers_own(kimi):
    """transformers 5.24 loads the published names itself (conversion_mapping's
    kimi_linear entry); this loader's state dict is the same, tensor for tensor, and the
    same as the native folder the weights came from."""
    folder, reference = kimi
    ours = PyptoKimiLinearForCausalLM.from_pretrained(folder, dtype="float32").state_dict()
    theirs, info = KimiLinearForCausalLM.from_pretrained(
        folder, dtype=torch.float32, output_loading_info=True
    )
    assert not any(info.values()), info
    ref = KimiLinearForCausalLM.from_pretrained(reference, dtype=torch.float32).state_dict()
    for other in (theirs.state_dict(), ref):
        assert set(ours) == set(other)
        assert [k for k in ours if not torch.equal(ours[k], other[k])] == []


def test_bfloat16_keeps_what_native_transformers_keeps_in_float32(kimi):
    folder, _ = kimi
    ours = PyptoKimiLinearForCausalLM.from_pretrained(folder)  # "auto": the release's bf16
    native = KimiLinearForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    a, b = ours.state_dict(), native.state_dict()
    assert {k: v.dtype for k, v in a.items()} == {k: v.dtype for k, v in b.items()}
    assert a["model.layers.0.self_attn.forget_gate.dt_bias"].dtype == torch.float32
    assert a["model.layers.1.mlp.gate.weight"].dtype == torch.float32
    assert a["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    assert a["model.layers.1.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def test_the_names_map_as_transformers_conversion_maps_them():
    assert target_of("model.layers.3.self_attn.f_a_proj.weight").key == (
        "model.layers.3.self_attn.forget_gate.f_a_proj.weight"
    )
    assert target_of("model.layers.3.self_attn.dt_bias").key == (
        "model.layers.3.self_attn.forget_gate.dt_bias"
    )
    t = target_of("model.layers.3.self_attn.v_conv1d.weight")
    assert (t.key, t.kind, t.part) == ("model.layers.3.self_attn.conv1d.weight", "conv", "v")
    t = target_of("model.layers.9.block_sparse_moe.experts.17.w3.weight")
    assert (t.key, t.kind, t.part, t.index) == (
        "model.layers.9.mlp.experts.gate_up_proj",
        "expert",
        "up",
        17,
    )
    assert target_of("model.layers.9.block_sparse_moe.shared_experts.up_proj.weight").key == (
        "model.layers.9.mlp.shared_experts.up_proj.weight"
    )
    for same in ("model.layers.0.mlp.up_proj.weight", "model.layers.3.self_attn.kv_b_proj.weight"):
        assert target_of(same).key == same


# --- hostile folders ------------------------------------------------------------------------


def _break_duplicate(folder):
    """The same tensor in both shards (two downloads mixed)."""
    key = "model.layers.2.self_attn.kv_b_proj.weight"
    value = load_file(str(shard_of(folder, key)))[key]
    rewrite_shard(other_shard(folder, key), lambda t: t.update({key: value}))


def _break_alias(folder):
    """A tensor under its published and its native name: both would fill one parameter."""
    key = "model.layers.1.self_attn.f_a_proj.weight"
    value = load_file(str(shard_of(folder, key)))[key]
    native = "model.layers.1.self_attn.forget_gate.f_a_proj.weight"
    rewrite_shard(shard_of(folder, key), lambda t: t.update({native: value.clone()}))


def _break_missing(folder):
    key = "model.layers.2.self_attn.kv_a_layernorm.weight"
    rewrite_shard(shard_of(folder, key), lambda t: t.pop(key))
    index = index_of(folder)
    del index["weight_map"][key]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _break_missing_expert(folder):
    key = "model.layers.3.block_sparse_moe.experts.6.w3.weight"
    rewrite_shard(shard_of(folder, key), lambda t: t.pop(key))


def _break_missing_conv(folder):
    key = "model.layers.1.self_attn.k_conv1d.weight"
    rewrite_shard(shard_of(folder, key), lambda t: t.pop(key))


def _break_nan(folder):
    poison(folder, "model.layers.3.self_attn.o_proj.weight", {(3, 5): float("nan")})


def _break_inf(folder):
    poison(
        folder,
        "model.layers.4.block_sparse_moe.experts.1.w2.weight",
        {(0, 0): float("inf"), (1, 1): float("-inf")},
    )


def _break_scale_beside_bf16(folder):
    """A block scale beside a weight that is not FP8: applying it would corrupt the weight."""
    key = "model.layers.2.self_attn.q_proj.weight"
    scale = "model.layers.2.self_attn.q_proj.weight_scale_inv"
    rewrite_shard(shard_of(folder, key), lambda t: t.update({scale: torch.full((1, 1), 1000.0)}))


def _break_integer_scale(folder):
    key = "model.layers.2.self_attn.q_proj.weight"
    scale = "model.layers.2.self_attn.q_proj.weight_scale_inv"
    rewrite_shard(
        shard_of(folder, key),
        lambda t: t.update({scale: torch.ones((1, 1), dtype=torch.int32)}),
    )


def _break_shape(folder):
    key = "model.layers.2.self_attn.kv_b_proj.weight"
    rewrite_shard(shard_of(folder, key), lambda t: t.update({key: t[key][:, :16].contiguous()}))


def _break_expert_shape(folder):
    key = "model.layers.1.block_sparse_moe.experts.2.w1.weight"
    rewrite_shard(shard_of(folder, key), lambda t: t.update({key: t[key][:, :8].contiguous()}))


def _break_extra(folder):
    key = "model.layers.0.self_attn.o_proj.weight"
    rewrite_shard(
        shard_of(folder, key),
        lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": torch.zeros(64)}),
    )


def _break_extra_expert(folder):
    key = "model.layers.1.block_sparse_moe.experts.0.w2.weight"
    rewrite_shard(
        shard_of(folder, key),
        lambda t: t.update({"model.layers.1.block_sparse_moe.experts.8.w2.weight": t[key].clone()}),
    )


def _break_missing_shard(folder):
    next(folder.glob("model-00002-of-*.safetensors")).unlink()


def _break_escaping_index(folder):
    index = index_of(folder)
    index["weight_map"]["lm_head.weight"] = "../outside.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _break_header(folder):
    next(folder.glob("model-00001-of-*.safetensors")).write_bytes(b"\xff" * 64)


def _break_layer_plan(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["linear_attn_config"]["full_attn_layers"] = [3]
    (folder / "config.json").write_text(json.dumps(cfg))


BROKEN = [
    (_break_duplicate, KimiWeightsError, "weight model.layers.2.self_attn.kv_b_proj.weight is stored twice (in model-0000", "re-download"),
    (_break_alias, KimiWeightsError, "model.layers.1.self_attn.f_a_proj.weight and model.layers.1.self_attn.forget_gate.f_a_proj.weight both load into model.layers.1.self_attn.forget_gate.f_a_proj.weight", "re-download"),
    (_break_missing, KimiWeightsError, "lacks weights for layer 2 (model.layers.2.self_attn.kv_a_layernorm.weight)", "re-download"),
    (_break_missing_expert, KimiWeightsError, "lacks weights for layer 3 (model.layers.3.block_sparse_moe.experts.6.w3.weight)", "re-download"),
    (_break_missing_conv, KimiWeightsError, "lacks weights for layer 1 (model.layers.1.self_attn.k_conv1d.weight)", "re-download"),
    (_break_nan, KimiWeightsError, "weight model.layers.3.self_attn.o_proj.weight in model-0000", "1 non-finite value (NaN or inf)"),
    (_break_inf, KimiWeightsError, "model.layers.4.block_sparse_moe.experts.1.w2.weight", "2 non-finite values (NaN or inf)"),
    (_break_scale_beside_bf16, KimiWeightsError, "model.layers.2.self_attn.q_proj.weight_scale_inv in model-0000", "not FP8"),
    (_break_integer_scale, KimiWeightsError, "model.layers.2.self_attn.q_proj.weight_scale_inv in model-0000", "is stored as I32, not a float"),
    (_break_shape, KimiWeightsError, "weight model.layers.2.self_attn.kv_b_proj.weight is [128, 16] in the checkpoint but config.json makes it [128, 32]", "re-download"),
    (_break_expert_shape, KimiWeightsError, "parts of model.layers.1.mlp.experts.gate_up_proj do not fit together", "re-download"),
    (_break_extra, KimiWeightsError, "does not describe, for layer 0 (model.layers.0.self_attn.o_proj.bias)", "re-download"),
    (_break_extra_expert, KimiWeightsError, "does not describe, for layer 1 (model.layers.1.block_sparse_moe.experts.8.w2.weight)", "re-download"),
    (_break_missing_shard, KimiWeightsError, "missing: the download is incomplete", "re-download"),
    (_break_escaping_index, KimiWeightsError, "outside the folder", "re-download"),
    (_break_header, KimiWeightsError, "not a readable safetensors file", "re-download"),
    (_break_layer_plan, KimiConfigError, "layer(s) [5] in neither", "re-download"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("breaker", "error", "problem", "fix"), BROKEN, ids=[b[0].__name__ for b in BROKEN]
)
def test_a_broken_folder_is_one_line_and_nothing_is_written(
    kimi, copy_of, snapshot, breaker, error, problem, fix
):
    folder = copy_of(kimi[0])
    breaker(folder)
    before = snapshot(folder)
    with pytest.raises(error) as info:
        PyptoKimiLinearForCausalLM.from_pretrained(folder, dtype="float32")
    message = str(info.value)
    assert problem in message
    assert fix in message
    assert "\n" not in message
    assert snapshot(folder) == before


@pytest.mark.parametrize(
    "ref",
    [
        "moonshotai/Kimi-Linear-48B-A3B-Instruct--modeling_kimi.KimiLinearForCausalLM",
        "/tmp/elsewhere/modeling_kimi.KimiLinearForCausalLM",
    ],
)
def test_a_pinned_auto_map_edited_to_point_outside_is_one_line(pinned, snapshot, ref):
    """Loading through the pin: the pinned config class reads config.json first and
    refuses before transformers resolves the model class (so nothing is fetched or run)."""
    cfg = json.loads((pinned / "config.json").read_text())
    cfg["auto_map"]["AutoModelForCausalLM"] = ref
    (pinned / "config.json").write_text(json.dumps(cfg, indent=2))
    before = snapshot(pinned)
    with pytest.raises(KimiConfigError) as info:
        AutoModelForCausalLM.from_pretrained(pinned, trust_remote_code=True, local_files_only=True)
    message = str(info.value)
    assert f"auto_map['AutoModelForCausalLM'] = {ref!r} points outside the folder" in message
    assert "re-pin the folder" in message
    assert "\n" not in message
    with pytest.raises(KimiConfigError, match="points outside the folder"):
        PyptoKimiLinearForCausalLM.from_pretrained(pinned)
    assert snapshot(pinned) == before


def test_an_auto_config_pointing_outside_is_caught_by_verify_before_loading(pinned, snapshot):
    """Where the pinned config class itself is bypassed, pypto-patch's verify_pinned (run by
    pypto-e2e right before a remote-code load) refuses in one line."""
    from pypto_patch import NotPinnedError, verify_pinned

    cfg = json.loads((pinned / "config.json").read_text())
    cfg["auto_map"]["AutoConfig"] = (
        "moonshotai/Kimi-Linear-48B-A3B-Instruct--configuration_kimi.KimiLinearConfig"
    )
    (pinned / "config.json").write_text(json.dumps(cfg, indent=2))
    before = snapshot(pinned)
    with pytest.raises(NotPinnedError) as info:
        verify_pinned(pinned)
    assert "another repository" in str(info.value)
    assert "\n" not in str(info.value)
    assert snapshot(pinned) == before


def test_not_a_folder_and_unknown_options_are_one_line(tmp_path, kimi):
    with pytest.raises(KimiConfigError, match="is not a local model folder"):
        PyptoKimiLinearForCausalLM.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(KimiConfigError, match=r"quantization_config are not supported"):
        PyptoKimiLinearForCausalLM.from_pretrained(kimi[0], quantization_config={})
    with pytest.raises(KimiConfigError, match="dtype 'int8' is not one of"):
        PyptoKimiLinearForCausalLM.from_pretrained(kimi[0], dtype="int8")
