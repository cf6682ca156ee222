"""The published config.json read into transformers' native config, and what is refused."""

from __future__ import annotations

import copy

import pytest
from transformers import KimiLinearConfig

from pypto_models_kimi import KimiConfigError
from pypto_models_kimi.checks import PRESET_AUTO_MAP, check_auto_map
from pypto_models_kimi.configuration import PyptoKimiLinearConfig, native_config_dict
from pypto_testing.kimi import KIMI_LINEAR_48B_A3B_CONFIG, kimi_layer_plan, tiny_kimi_linear_config


def _release(**changes):
    cfg = copy.deepcopy(KIMI_LINEAR_48B_A3B_CONFIG)
    cfg.update(changes)
    return cfg


def test_the_release_config_reads_into_the_native_fields():
    cfg = PyptoKimiLinearConfig.from_dict(_release())
    mla = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    assert mla == [3, 7, 11, 15, 19, 23, 26]  # the 1-based 4, 8, ..., 24, 27
    assert cfg.layer_types.count("linear_attention") == 20
    assert cfg.mlp_layer_types == ["dense"] + ["sparse"] * 26
    assert (cfg.num_local_experts, cfg.num_experts_per_tok, cfg.n_shared_experts) == (256, 8, 1)
    assert (cfg.norm_topk_prob, cfg.n_group, cfg.topk_group) == (True, 1, 1)
    assert cfg.routed_scaling_factor == 2.446
    assert (cfg.linear_num_heads, cfg.linear_head_dim, cfg.linear_conv_kernel_dim) == (32, 128, 4)
    assert (cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim) == (
        512,
        128,
        64,
        128,
    )
    assert cfg.q_lora_rank is None
    assert cfg.max_position_embeddings == 1048576
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (163839, 163584, 163586)


def test_on_the_release_the_native_config_reads_the_same_plan():
    """Where both read the dict, this config and transformers' own agree (what differs is
    only the refusals and moe_layer_freq, below)."""
    ours = PyptoKimiLinearConfig.from_dict(_release())
    native = KimiLinearConfig.from_dict(_release())
    for field in (
        "layer_types",
        "mlp_layer_types",
        "num_local_experts",
        "num_experts_per_tok",
        "n_shared_experts",
        "norm_topk_prob",
        "n_group",
        "topk_group",
        "linear_num_heads",
        "linear_head_dim",
        "linear_conv_kernel_dim",
        "qk_head_dim",
        "head_dim",
        "max_position_embeddings",
    ):
        assert getattr(ours, field) == getattr(native, field), field


def test_moe_layer_freq_is_honoured_as_the_published_modeling_reads_it():
    cfg = PyptoKimiLinearConfig.from_dict(
        tiny_kimi_linear_config(moe_layer_freq=2, first_k_dense_replace=1)
    )
    assert cfg.mlp_layer_types == ["dense", "dense", "sparse", "dense", "sparse"]
    assert cfg.mlp_layer_types == kimi_layer_plan(tiny_kimi_linear_config(moe_layer_freq=2))[1]
    # transformers' own config ignores moe_layer_freq: every layer past the first is MoE
    native = KimiLinearConfig.from_dict(tiny_kimi_linear_config(moe_layer_freq=2))
    assert native.mlp_layer_types == ["dense"] + ["sparse"] * 4


def test_ungrouped_top_k_becomes_one_expert_group():
    cfg = PyptoKimiLinearConfig.from_dict(
        tiny_kimi_linear_config(use_grouped_topk=False, num_expert_group=4, topk_group=2)
    )
    assert (cfg.n_group, cfg.topk_group) == (1, 1)


def test_a_saved_config_reads_back_the_same(tmp_path):
    cfg = PyptoKimiLinearConfig.from_dict(tiny_kimi_linear_config())
    cfg.save_pretrained(tmp_path)
    again = PyptoKimiLinearConfig.from_pretrained(tmp_path)
    assert again.layer_types == cfg.layer_types
    assert again.mlp_layer_types == cfg.mlp_layer_types
    assert again.num_local_experts == cfg.num_local_experts


def _lac(**changes):
    lac = copy.deepcopy(tiny_kimi_linear_config()["linear_attn_config"])
    lac.update(changes)
    return lac


REFUSED = [
    ({"model_type": "llama"}, "model_type 'llama', not 'kimi_linear'", "pypto-patch list"),
    ({"linear_attn_config": _lac(kda_layers=[1, 2])}, "layer(s) [4] in neither", "re-download"),
    ({"linear_attn_config": _lac(kda_layers=[1, 2, 3, 4])}, "layer(s) [3] in both", "re-download"),
    ({"linear_attn_config": _lac(kda_layers=[0, 1, 2, 4])}, "not a list of 1-based layer numbers in 1..5", "re-download"),
    ({"linear_attn_config": None}, "no linear_attn_config", "re-download"),
    ({"moe_router_activation_func": "softmax"}, "moe_router_activation_func is 'softmax'", "cannot run"),
    ({"mla_use_nope": False}, "mla_use_nope is False", "cannot run"),
    ({"q_lora_rank": 16}, "q_lora_rank is 16", "cannot run"),
    ({"num_key_value_heads": 2}, "num_key_value_heads 2 differs", "cannot run"),
    ({"num_nextn_predict_layers": 1}, "num_nextn_predict_layers 1", "cannot run"),
    ({"tie_word_embeddings": True}, "ties the word embeddings", "cannot run"),
    ({"quantization_config": {"quant_method": "compressed-tensors"}}, "quantization_config ('compressed-tensors')", "Kimi-Linear-48B-A3B-Instruct"),
    ({"num_experts": None}, "num_experts is None", "re-download"),
    ({"first_k_dense_replace": 0, "mlp_layer_types": ["dense"] * 5}, "mlp_layer_types disagree", "re-download"),
    ({"num_experts_per_token": 9}, "num_experts_per_token 9 is not in 1..8", "re-download"),
    ({"num_expert_group": 3}, "do not divide its 8 experts", "re-download"),
    ({"moe_layer_freq": 0}, "moe_layer_freq is 0", "re-download"),
    # absurd layer counts are bounded before anything is built from them (1e9 was a
    # MemoryError traceback, 3e6 a 26 MB "one-line" error listing every layer)
    ({"num_hidden_layers": 10**9}, "num_hidden_layers is 1000000000, more than the 1024", "hostile"),
    ({"num_hidden_layers": 1000, "linear_attn_config": _lac(kda_layers=[1, 2])},
     "in neither", "re-download"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "problem", "fix"), REFUSED, ids=[r[1][:40] for r in REFUSED])
def test_what_the_native_classes_would_compute_differently_is_one_line(change, problem, fix):
    with pytest.raises(KimiConfigError) as info:
        PyptoKimiLinearConfig.from_dict(tiny_kimi_linear_config(**change))
    message = str(info.value)
    assert problem in message
    assert fix in message
    assert "\n" not in message
    assert len(message) < 600  # listed layers are clipped


def test_native_config_dict_leaves_the_input_alone():
    cfg = tiny_kimi_linear_config()
    before = copy.deepcopy(cfg)
    out = native_config_dict(cfg)
    assert cfg == before
    assert out["layer_types"][2] == "full_attention"


OUTSIDE = [
    ("AutoModelForCausalLM", "moonshotai/Kimi-Linear-48B-A3B-Instruct--modeling_kimi.KimiLinearForCausalLM", "code from another repository"),
    ("AutoModelForCausalLM", "/tmp/elsewhere/modeling_kimi.KimiLinearForCausalLM", "not 'module.Class'"),
    ("AutoModel", "../modeling_kimi.KimiLinearModel", "not 'module.Class'"),
]  # fmt: skip


@pytest.mark.parametrize(("key", "ref", "why"), OUTSIDE)
def test_an_auto_map_pointing_outside_the_folder_is_refused(key, ref, why):
    for auto_map in (
        {**tiny_kimi_linear_config()["auto_map"], key: ref},  # the repo's own map
        {**PRESET_AUTO_MAP, key: ref},  # a pinned map, edited afterwards
    ):
        with pytest.raises(KimiConfigError) as info:
            check_auto_map({"auto_map": auto_map})
        message = str(info.value)
        assert f"auto_map[{key!r}] = {ref!r} points outside the folder" in message
        assert why in message
        assert "re-pin the folder (pypto-patch apply --model-family kimi_linear_48b_a3b)" in message
        assert "\n" not in message


def test_a_pinned_auto_map_must_be_exactly_the_preset_s():
    check_auto_map({"auto_map": dict(PRESET_AUTO_MAP)})
    check_auto_map({"auto_map": tiny_kimi_linear_config()["auto_map"]})  # loaded directly
    with pytest.raises(
        KimiConfigError,
        match=r"auto_map\['AutoModel'\] = 'modeling_kimi.KimiLinearModel' is not the kimi_linear_48b_a3b preset's class, so the folder's own code would run",
    ):
        check_auto_map(
            {"auto_map": {**PRESET_AUTO_MAP, "AutoModel": "modeling_kimi.KimiLinearModel"}}
        )
