"""Folders that must not load: one line naming the problem and the fix, nothing written."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from pypto_models_gemma4 import Gemma4ConfigError
from pypto_models_gemma4.modeling import Gemma4WeightsError


def _load(folder):
    return AutoModelForCausalLM.from_pretrained(
        folder, trust_remote_code=True, local_files_only=True
    )


def _rewrite_weights(folder, change):
    weights = load_file(folder / "model.safetensors")
    save_file(change(dict(weights)), folder / "model.safetensors", metadata={"format": "pt"})


def _one_line(err):
    text = str(err.value)
    assert "\n" not in text, text
    return text


def test_a_checkpoint_lacking_a_layer_s_weights_is_refused(tiny_31b, pinned_copy, snapshot):
    folder = pinned_copy(tiny_31b, "gemma4_31b_it")
    _rewrite_weights(
        folder, lambda w: {k: v for k, v in w.items() if "language_model.layers.4." not in k}
    )
    before = snapshot(folder)
    with pytest.raises(Gemma4WeightsError) as err:
        _load(folder)
    msg = _one_line(err)
    assert "lacks weights for the text decoder's layer 4 (model.language_model.layers.4." in msg
    assert "re-download the model" in msg
    assert snapshot(folder) == before


def test_a_missing_vision_tower_is_refused_not_half_loaded(tiny_31b, pinned_copy):
    folder = pinned_copy(tiny_31b, "gemma4_31b_it")
    _rewrite_weights(folder, lambda w: {k: v for k, v in w.items() if "vision_tower" not in k})
    with pytest.raises(Gemma4WeightsError) as err:
        _load(folder)
    assert "lacks weights for the vision tower's layers 0, 1 (model.vision_tower." in _one_line(err)


def test_a_weight_of_the_wrong_shape_is_refused(tiny_31b, pinned_copy, snapshot):
    folder = pinned_copy(tiny_31b, "gemma4_31b_it")
    key = "model.language_model.layers.5.self_attn.k_proj.weight"  # a full layer: 1 x 32
    _rewrite_weights(folder, lambda w: {**w, key: torch.zeros(64, 64)})
    before = snapshot(folder)
    with pytest.raises(Gemma4WeightsError) as err:
        _load(folder)
    msg = _one_line(err)
    assert f"weight {key} is [64, 64] in the checkpoint but config.json makes it [32, 64]" in msg
    assert snapshot(folder) == before


def test_weights_for_a_layer_the_config_lacks_are_refused(tiny_31b, pinned_copy):
    folder = pinned_copy(tiny_31b, "gemma4_31b_it")
    extra = "model.language_model.layers.6.mlp.down_proj.weight"  # the config has 6 layers
    _rewrite_weights(folder, lambda w: {**w, extra: torch.zeros(64, 128)})
    with pytest.raises(Gemma4WeightsError) as err:
        _load(folder)
    assert "weights config.json does not describe, for the text decoder's layer 6" in _one_line(err)


def test_a_llama_folder_pinned_as_gemma4_31b_it_is_refused(tmp_path, pinned_copy, snapshot):
    from pypto_testing.models import make_tiny_model

    llama = make_tiny_model(tmp_path / "llama", "llama")
    folder = pinned_copy(llama, "gemma4_31b_it")
    before = snapshot(folder)
    with pytest.raises(Gemma4ConfigError) as err:
        _load(folder)
    msg = _one_line(err)
    assert "not a Gemma 4 checkpoint (model_type 'llama'" in msg
    assert "gemma4_31b_it" in msg
    assert snapshot(folder) == before


def test_the_e2b_variant_pinned_as_31b_names_the_preset_that_fits(tiny_e2b, pinned_copy):
    folder = pinned_copy(tiny_e2b, "gemma4_31b_it")
    with pytest.raises(Gemma4ConfigError) as err:
        _load(folder)
    assert "pin it with gemma4_e4b_it or gemma4_e2b_it instead" in _one_line(err)


def test_an_unsupported_variant_is_refused(tiny_31b, pinned_copy, snapshot):
    folder = pinned_copy(tiny_31b, "gemma4_31b_it")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["text_config"]["use_bidirectional_attention"] = "all"
    (folder / "config.json").write_text(json.dumps(cfg))
    before = snapshot(folder)
    with pytest.raises(Gemma4ConfigError) as err:
        _load(folder)
    assert "encoder, not a causal decoder" in _one_line(err)
    assert snapshot(folder) == before


def test_patch_refuses_a_folder_that_does_not_fit_before_writing(tmp_path):
    """pypto-patch runs the preset's check first: a Llama folder (or the E2B checkpoint)
    pinned as gemma4_31b_it is refused in one line and left byte-identical."""
    import subprocess
    import sys

    from pypto_patch import EXIT
    from pypto_testing.gemma4 import make_tiny_gemma4
    from pypto_testing.models import make_tiny_model

    for folder in (
        make_tiny_model(tmp_path / "llama", "llama"),
        make_tiny_gemma4(tmp_path / "e2b", "e2b"),
    ):
        before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pypto_patch",
                "apply",
                "--model-family",
                "gemma4_31b_it",
                "--model-path",
                str(folder),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == EXIT.USAGE, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "does not fit preset 'gemma4_31b_it'" in proc.stderr
        assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
