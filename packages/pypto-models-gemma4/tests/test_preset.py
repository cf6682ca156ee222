"""The presets: registered, well formed, and what auto_map points at after pinning."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    Gemma4ForConditionalGeneration,
)

from pypto_models_gemma4 import VARIANTS
from pypto_models_gemma4.configuration import CONFIG_CLASSES
from pypto_models_gemma4.modeling import MODEL_CLASSES, PyptoGemma4ForConditionalGeneration
from pypto_models_gemma4.preset import PRESETS


def test_every_variant_is_an_entry_point_with_a_one_line_description():
    eps = {ep.name: ep for ep in entry_points(group="pypto.model_families")}
    for family in VARIANTS:
        assert family in eps, family
        preset = eps[family].load()
        assert preset is PRESETS[family]
        assert preset["family"] == family
        assert preset["description"]
        assert "\n" not in preset["description"]
        assert set(preset["auto_map"]) == {
            "AutoConfig",
            "AutoModelForCausalLM",
            "AutoModelForImageTextToText",
        }
        for target in preset["auto_map"].values():
            assert target.split(".")[0] + ".py" in preset["files"]
    assert set(CONFIG_CLASSES) == set(MODEL_CLASSES) == set(VARIANTS)


def test_presets_pass_pypto_patch_validation():
    presets = pytest.importorskip("pypto_patch.presets")
    for family, data in PRESETS.items():
        preset = presets.Preset.from_dict(data, expected_family=family)
        assert preset.family == family


@pytest.mark.parametrize("auto", [AutoModelForCausalLM, AutoModelForImageTextToText])
def test_the_pinned_folder_loads_this_package_s_classes(tiny_31b, pinned_copy, auto):
    folder = pinned_copy(tiny_31b, "gemma4_31b_it")
    cfg = AutoConfig.from_pretrained(folder, trust_remote_code=True, local_files_only=True)
    assert type(cfg) is CONFIG_CLASSES["gemma4_31b_it"]
    model = auto.from_pretrained(folder, trust_remote_code=True, local_files_only=True)
    assert type(model) is MODEL_CLASSES["gemma4_31b_it"]
    assert isinstance(model, Gemma4ForConditionalGeneration)
    assert model.pypto_model_family == "gemma4"


def test_weights_and_logits_are_the_native_model_s(tiny_31b):
    """No vendored copy: same modules, same weight names, bit-identical logits."""
    ours = PyptoGemma4ForConditionalGeneration.from_pretrained(tiny_31b).eval()
    native = Gemma4ForConditionalGeneration.from_pretrained(tiny_31b).eval()
    a, b = ours.state_dict(), native.state_dict()
    assert list(a) == list(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    ids = torch.tensor([[5, 77, 120, 33, 9, 200, 41, 12, 90, 3, 44]])
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).logits, native(input_ids=ids).logits)
    # the tower is loaded, accounted for, and not part of text decode
    assert ours.pypto_towers["vision"] == sum(
        p.numel() for p in ours.model.vision_tower.parameters()
    )
    assert ours.pypto_towers["audio"] is None
