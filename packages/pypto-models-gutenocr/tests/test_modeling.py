import pytest
import torch
from transformers import Qwen2_5_VLForConditionalGeneration

import pypto_kernels_gutenocr as pk
from pypto_kernels_gutenocr.plugin import PLUGIN
from pypto_models_gutenocr import GutenOCRForConditionalGeneration
from pypto_models_gutenocr.modeling import (
    GutenOCRTextMLP,
    GutenOCRTextRMSNorm,
)
from pypto_models_gutenocr.runner import ImageTextProcessor, load_processor


@pytest.fixture(scope="module")
def models(tiny_gutenocr):
    ours = GutenOCRForConditionalGeneration.from_pretrained(
        str(tiny_gutenocr), dtype=torch.float32
    ).eval()
    native = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        str(tiny_gutenocr), dtype=torch.float32
    ).eval()
    return ours, native


@pytest.fixture(scope="module")
def image_inputs(models, tiny_gutenocr, tiny_image):
    from PIL import Image

    proc = load_processor(tiny_gutenocr, True, models[0].config)
    assert isinstance(proc, ImageTextProcessor)
    img = Image.open(tiny_image).convert("RGB")
    return proc(text=["<|vision_start|><|image_pad|><|vision_end|>read"], images=[img])


def _logits(model, **inputs):
    with torch.no_grad():
        return model(**inputs).logits


def test_weights_load_completely_and_hooks_sit_only_in_the_text_decoder(models):
    ours, native = models
    for (n1, p1), (n2, p2) in zip(
        ours.state_dict().items(), native.state_dict().items(), strict=True
    ):
        assert n1 == n2
        assert torch.equal(p1, p2), n1
    assert ours.hook_counts == {
        "GutenOCRTextRMSNorm": 5,
        "GutenOCRTextMLP": 2,
        "GutenOCRTextRotaryEmbedding": 1,
        "GutenOCRTextAttention": 2,
    }
    vision_types = {type(m) for m in ours.model.visual.modules()}
    assert not any(t.__module__.startswith("pypto_models_gutenocr") for t in vision_types)
    assert isinstance(ours.model.language_model.norm, GutenOCRTextRMSNorm)
    assert isinstance(ours.model.language_model.layers[0].mlp, GutenOCRTextMLP)


def test_switches_off_logits_identical_to_native_text_and_image(models, image_inputs):
    ours, native = models
    ids = torch.tensor([[5, 77, 120, 33, 9, 200, 41]])
    assert torch.equal(_logits(ours, input_ids=ids), _logits(native, input_ids=ids))
    assert torch.equal(_logits(ours, **image_inputs), _logits(native, **image_inputs))
    assert pk.report()["calls"]["rms_norm"] == {"pypto": 0, "reference": 0}


@pytest.mark.parametrize("op", ["rms_norm", "mrope", "swiglu_mlp"])
def test_each_switch_through_the_fallback_stays_within_tolerance(
    models, image_inputs, op, monkeypatch
):
    monkeypatch.setenv("PYPTO_GUTENOCR_CPU_SIM", "0")
    ours, _ = models
    off = _logits(ours, **image_inputs)
    with pk.pto_switches({op: True}):
        on = _logits(ours, **image_inputs)
    torch.testing.assert_close(on, off, rtol=1e-4, atol=1e-4)
    calls = pk.report()["calls"][op]
    expected = {"rms_norm": 5, "mrope": 2, "swiglu_mlp": 2}[op]  # text decoder only, never vision
    assert calls == {"pypto": 0, "reference": expected}


@pytest.mark.slow
@pytest.mark.parametrize("op", ["rms_norm", "mrope", "swiglu_mlp"])
def test_each_switch_through_the_pypto_kernel_stays_within_tolerance(models, image_inputs, op):
    pytest.importorskip("pypto")
    ours, _ = models
    off = _logits(ours, **image_inputs)
    with pk.pto_switches({op: True}):
        on = _logits(ours, **image_inputs)
    calls = pk.report()["calls"][op]
    assert calls["reference"] == 0, pk.report()
    assert calls["pypto"] > 0
    torch.testing.assert_close(on, off, rtol=1e-3, atol=1e-3)


def test_plugin_claims_gutenocr_but_not_the_native_model(models):
    ours, native = models
    assert PLUGIN.applies_to(ours)
    assert not PLUGIN.applies_to(native)
