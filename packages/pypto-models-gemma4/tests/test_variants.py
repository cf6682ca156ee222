"""Which config.json each preset accepts: the published structures, one-line refusals."""

from __future__ import annotations

import copy

import pytest

from pypto_models_gemma4.variants import VARIANTS, Gemma4ConfigError, check_config_dict
from pypto_testing.gemma4 import GEMMA4_31B_CONFIG

S, F = "sliding_attention", "full_attention"
REAL_31B = GEMMA4_31B_CONFIG  # google/gemma-4-31B-it's config.json as published


def _with(**text):
    cfg = copy.deepcopy(REAL_31B)
    cfg["text_config"].update(text)
    return cfg


E2B_LIKE = _with(hidden_size_per_layer_input=256, num_kv_shared_layers=20, attention_k_eq_v=False)
MOE_LIKE = _with(enable_moe_block=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704)
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}


def test_the_published_31b_config_is_the_31b_variant():
    assert check_config_dict(REAL_31B, "gemma4_31b_it").family == "gemma4_31b_it"
    assert check_config_dict(REAL_31B).family == "gemma4_31b_it"


@pytest.mark.parametrize(
    ("config", "families"),
    [
        (MOE_LIKE, {"gemma4_26b_a4b_it"}),
        (E2B_LIKE, {"gemma4_e2b_it", "gemma4_e4b_it"}),
    ],
)
def test_each_variant_is_accepted_by_its_presets_only(config, families):
    for family in VARIANTS:
        if family in families:
            assert check_config_dict(config, family).family == family
        else:
            with pytest.raises(Gemma4ConfigError, match=r"pin it with gemma4_"):
                check_config_dict(config, family)


def test_a_llama_folder_pinned_as_31b_is_refused_in_one_line():
    with pytest.raises(Gemma4ConfigError) as err:
        check_config_dict(LLAMA, "gemma4_31b_it")
    msg = str(err.value)
    assert "\n" not in msg
    assert "not a Gemma 4 checkpoint (model_type 'llama'" in msg
    assert "gemma4_31b_it" in msg
    assert "pypto-patch restore" in msg


def test_the_e2b_checkpoint_pinned_as_31b_names_the_preset_that_fits():
    with pytest.raises(Gemma4ConfigError) as err:
        check_config_dict(E2B_LIKE, "gemma4_31b_it")
    msg = str(err.value)
    assert "per-layer input embeddings, KV-sharing layers" in msg
    assert "pin it with gemma4_e4b_it or gemma4_e2b_it instead" in msg


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({**REAL_31B, "model_type": "gemma4_text"}, "Gemma 4 variant"),
        ({**REAL_31B, "model_type": "gemma4_unified"}, "'gemma4_unified' is a Gemma 4 variant"),
        (_with(use_bidirectional_attention="all"), "encoder, not a causal decoder"),
        (_with(layer_types=[S, "chunked_attention", F]), "['chunked_attention']"),
        (_with(layer_types="sliding"), "list of strings"),
        (_with(sliding_window=0), "sliding_window must be a positive integer"),
        (
            _with(enable_moe_block=True, hidden_size_per_layer_input=8, num_kv_shared_layers=2),
            "matches no published variant",
        ),
        ({k: v for k, v in REAL_31B.items() if k != "text_config"}, "no text_config"),
        ([1, 2], "JSON list, not an object"),
    ],
    ids=[
        "text-only",
        "unified",
        "bidirectional",
        "unknown-layer-type",
        "layer-types-not-list",
        "window-0",
        "moe-and-ple",
        "no-text-config",
        "not-an-object",
    ],
)
def test_unsupported_configs_are_one_line_errors(config, needle):
    with pytest.raises(Gemma4ConfigError) as err:
        check_config_dict(config, "gemma4_31b_it")
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_an_unknown_preset_name_is_refused():
    with pytest.raises(Gemma4ConfigError, match="unknown Gemma 4 preset 'gemma4_7b'"):
        check_config_dict(REAL_31B, "gemma4_7b")
