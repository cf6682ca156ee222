"""pypto_testing.zoo: transformers' causal-LM mapping as tiny folders built by its own
classes; a type the generic recipe cannot make small is refused with why, never built
half-way (and never allocated at its published size)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from pypto_testing.zoo import (
    MAX_PARAMETERS,
    CannotBuildTiny,
    make_zoo_model,
    newest_types,
    type_year,
    zoo_config,
    zoo_types,
)


def test_the_zoo_is_the_installed_causal_lm_mapping():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = zoo_types()
    assert types == sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert len(types) >= 150
    newest = newest_types(10)
    years = [type_year(t) or 0 for t in newest]
    assert years == sorted(years, reverse=True)  # newest first
    assert set(newest) <= set(types)


def test_a_type_is_built_small_from_its_own_classes(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    folder = make_zoo_model(tmp_path / "olmo2", "olmo2")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "olmo2"
    assert cfg["hidden_size"] == 64
    assert cfg["num_hidden_layers"] == 2
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    assert type(model).__name__ == "Olmo2ForCausalLM"  # transformers' own class
    assert sum(p.numel() for p in model.parameters()) < MAX_PARAMETERS
    logits = model(input_ids=torch.tensor([[3, 4, 5]])).logits
    assert logits.shape == (1, 3, cfg["vocab_size"])
    assert float(logits.std()) > 0.1  # spread: greedy decoding does not collapse


def test_every_layer_kind_of_a_hybrid_pattern_is_kept():
    config = zoo_config("qwen3_next")
    kinds = set(config.layer_types)
    assert {"linear_attention", "full_attention"} <= kinds
    assert config.num_hidden_layers == len(config.layer_types) >= 2


def test_a_type_the_recipe_cannot_shrink_is_refused_with_why(tmp_path):
    """blt keeps dimensions the recipe does not know: sized on the meta device and refused,
    nothing allocated at its published size, nothing written."""
    if "blt" not in zoo_types():
        pytest.skip("this transformers has no blt")
    with pytest.raises(CannotBuildTiny, match="parameters at the generic small shape"):
        make_zoo_model(tmp_path / "blt", "blt")
    assert not (tmp_path / "blt").exists()


def test_what_a_config_derives_in_its_constructor_follows_the_small_values(tmp_path):
    """RWKV derives its attention width from hidden_size when it is constructed: set
    afterwards (the ``shrunk`` recipe) it kept 4096 and the forward failed; the
    ``constructed`` recipe calls the class with the small values, so it follows them."""
    if "rwkv" not in zoo_types():
        pytest.skip("this transformers has no rwkv")
    shrunk = zoo_config("rwkv", recipe="shrunk")
    assert shrunk.hidden_size == 64
    assert shrunk.attention_hidden_size != 64  # what the old recipe left behind
    constructed = zoo_config("rwkv", recipe="constructed")
    assert constructed.attention_hidden_size == constructed.hidden_size == 64
    folder = make_zoo_model(tmp_path / "rwkv", "rwkv")
    assert json.loads((folder / "zoo.json").read_text())["recipe"] == "constructed"


def test_sub_configs_are_made_small_too(tmp_path):
    """Gemma 3's vision tower kept its published size under the old recipe (93M
    parameters, refused); every sub-config now gets the small values."""
    if "gemma3" not in zoo_types():
        pytest.skip("this transformers has no gemma3")
    config = zoo_config("gemma3")
    assert config.vision_config.hidden_size == 64
    assert config.vision_config.num_hidden_layers == 2
    folder = make_zoo_model(tmp_path / "gemma3", "gemma3")
    assert json.loads((folder / "zoo.json").read_text())["parameters"] < MAX_PARAMETERS


def test_an_unknown_recipe_is_refused():
    with pytest.raises(ValueError, match="unknown zoo recipe 'tiny'"):
        zoo_config("llama", recipe="tiny")


def test_a_type_no_recipe_builds_names_each_reason(tmp_path):
    if "xlnet" not in zoo_types():
        pytest.skip("this transformers has no xlnet")
    with pytest.raises(CannotBuildTiny) as err:
        make_zoo_model(tmp_path / "xlnet", "xlnet")
    assert str(err.value).startswith("constructed: ")
    assert "; shrunk: " in str(err.value)
    assert not (tmp_path / "xlnet").exists()
