import json

import pytest

from pypto_models_llada2 import LLaDA2ConfigError, LLaDA2MoeConfig
from pypto_testing.llada2 import (
    LLADA2_FLASH_OVERRIDES,
    LLADA2_MINI_CONFIG,
    checkpoint_weight_shapes,
)


def _config(raw):
    return LLaDA2MoeConfig.from_dict(json.loads(json.dumps(raw)))


def test_the_published_mini_config_loads_with_every_field():
    cfg = _config(LLADA2_MINI_CONFIG)
    for key, value in LLADA2_MINI_CONFIG.items():
        if key in ("torch_dtype", "rope_scaling", "auto_map", "architectures"):
            continue
        assert getattr(cfg, key) == value, key
    assert cfg.rotary_dims == 64  # head_dim 128 x partial_rotary_factor 0.5
    assert cfg.is_moe_layer(0) is False
    assert cfg.is_moe_layer(1) is True
    assert cfg.auto_map["AutoModelForCausalLM"] == "modeling_llada2_moe.LLaDA2MoeModelLM"
    again = LLaDA2MoeConfig.from_dict(cfg.to_dict())
    assert again.to_dict() == cfg.to_dict()


@pytest.mark.parametrize(
    ("overrides", "billions"),
    [({}, 16.26), (LLADA2_FLASH_OVERRIDES, None)],
    ids=["mini", "flash"],
)
def test_checkpoint_sizes_match_the_published_totals(overrides, billions):
    raw = {**LLADA2_MINI_CONFIG, **overrides}
    _config(raw)  # loads
    total = 0
    for shape in checkpoint_weight_shapes(raw).values():
        n = 1
        for d in shape:
            n *= d
        total += n
    if billions is not None:
        assert abs(total / 1e9 - billions) < 0.05  # "LLaDA2.0-mini, 16B"
    else:
        assert 95e9 < total < 110e9  # "LLaDA2.0-flash, 100B"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"score_function": "softmax"}, "score_function"),
        ({"n_group": 7}, "n_group"),
        ({"topk_group": 9}, "topk_group"),
        ({"num_experts_per_tok": 200}, "num_experts_per_tok"),
        ({"rotary_dim": 32}, "rotary_dim"),
        ({"partial_rotary_factor": 0.01}, "partial_rotary_factor"),
        ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"norm_head": True}, "norm_head"),
    ],
)
def test_a_config_this_modeling_cannot_compute_exactly_is_refused_in_one_line(change, field):
    with pytest.raises(LLaDA2ConfigError) as info:
        _config({**LLADA2_MINI_CONFIG, **change})
    message = str(info.value)
    assert field in message
    assert "\n" not in message


@pytest.mark.parametrize("model_type", ["llama", "llada2_moe_veomni"])
def test_a_config_of_another_family_is_refused(model_type):
    raw = {**LLADA2_MINI_CONFIG, "model_type": model_type}
    if model_type == "llada2_moe_veomni":  # dFactory's name for the same network
        assert _config(raw).num_experts == 256
        return
    with pytest.raises(LLaDA2ConfigError, match="declares model_type 'llama'"):
        _config(raw)
