"""apply_capture_mitigations on real tiny models: effects, and a clean undo."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("transformers")
models = pytest.importorskip("pypto_testing.models")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from pypto_capture import (  # noqa: E402
    CaptureUnsafeConfigError,
    DecodeStepRunner,
    apply_capture_mitigations,
)


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    return models.make_tiny_model(tmp_path_factory.mktemp("tiny") / "gemma3", "gemma3")


def _forward(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_apply_then_undo_restores_model_exactly(gemma_dir):
    model = AutoModelForCausalLM.from_pretrained(gemma_dir).eval()  # default: sdpa
    ids = torch.tensor([[5, 9, 33, 70, 12, 6, 7, 8, 9, 10, 11]])
    before = _forward(model, ids)
    modeling = sys.modules[type(model.model).__module__]
    mask_fn = modeling.create_causal_mask
    rotary = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
    assert rotary

    handle = apply_capture_mitigations(model, max_positions=64)
    assert model.config._attn_implementation == "eager"
    assert modeling.create_causal_mask is not mask_fn
    assert all("forward" in vars(m) for m in rotary)  # every rotary module, not the first
    assert any(a.startswith("rotary:") for a in handle.applied)
    during = _forward(model, ids)
    # eager vs sdpa and table lookup vs recompute: the same function up to float rounding
    assert torch.allclose(during, before, atol=1e-4)

    handle.undo()
    assert model.config._attn_implementation == "sdpa"
    assert modeling.create_causal_mask is mask_fn
    assert all("forward" not in vars(m) for m in rotary)
    after = _forward(model, ids)
    assert torch.equal(after, before)
    handle.undo()  # idempotent


def test_require_eager_says_why(gemma_dir):
    model = AutoModelForCausalLM.from_pretrained(gemma_dir).eval()
    with pytest.raises(CaptureUnsafeConfigError, match="107025") as exc:
        apply_capture_mitigations(model, attn="require")
    assert "eager" in str(exc.value)
    assert model.config._attn_implementation == "sdpa"  # nothing changed


def test_rotary_tables_are_exact_and_mask_is_prebuilt(gemma_dir):
    model = AutoModelForCausalLM.from_pretrained(gemma_dir, attn_implementation="eager").eval()
    ids = torch.tensor([[5, 9, 33, 70, 12, 6, 7, 8, 9, 10, 11]])
    before = _forward(model, ids)
    with apply_capture_mitigations(model, attn="require", masks=False, max_positions=32):
        assert torch.equal(_forward(model, ids), before)  # gather of precomputed cos/sin

    # Decoding with the capture-safe cache goes through the patched mask functions.
    ref = DecodeStepRunner(model, batch_size=1, max_cache_len=24, backend="eager").generate(
        ids, max_new_tokens=6
    )
    with apply_capture_mitigations(model, attn="require", max_positions=32) as handle:
        assert any(a.startswith("mask:") for a in handle.applied)
        got = DecodeStepRunner(model, batch_size=1, max_cache_len=24, backend="eager").generate(
            ids, max_new_tokens=6
        )
        prebuilt = torch.zeros(1, 1, ids.shape[1], ids.shape[1])
        handle.use_mask({"full_attention": prebuilt})
        modeling = sys.modules[type(model.model).__module__]
        assert (
            modeling.create_causal_mask(
                config=model.config,
                inputs_embeds=torch.zeros(1, ids.shape[1], 64),
                attention_mask=None,
                cache=None,
            )
            is prebuilt
        )
    assert torch.equal(got, ref)


@pytest.mark.parametrize(
    ("backend", "device_type", "wanted"),
    [
        ("auto", "npu", True),  # auto is npugraph on an NPU
        ("npugraph", "npu", True),
        ("fused", "npu", True),  # torchair captures the compiled step into an NPU graph
        ("compile", "npu", False),
        ("eager", "npu", False),
        ("auto", "cuda", False),
        ("fused", "cuda", False),
        ("cudagraph", "cuda", False),
        ("auto", "cpu", False),
        ("compile", "cpu", False),
    ],
)
def test_the_one_rule_for_when_a_capture_needs_mitigations(backend, device_type, wanted):
    from pypto_capture import auto_backend_name, needs_capture_mitigations

    assert needs_capture_mitigations(backend, device_type) is wanted
    # auto means what resolve_backend_name makes of it on that device type
    assert auto_backend_name(device_type) == {"npu": "npugraph", "cuda": "fused"}.get(
        device_type, "compile"
    )


def test_recorded_prefill_masks_are_returned_prebuilt(gemma_dir):
    """A prefill has no capture-safe cache: one eager forward records the masks the model
    built, and the patched mask functions hand those back (no mask building under capture)."""
    model = AutoModelForCausalLM.from_pretrained(gemma_dir).eval()
    ids = torch.tensor([[5, 9, 33, 70, 12, 6, 7, 8, 9, 10, 11]])
    modeling = sys.modules[type(model.model).__module__]
    with apply_capture_mitigations(model, max_positions=ids.shape[1]) as handle:
        expected = _forward(model, ids)
        with handle.recording_masks():
            _forward(model, ids)
        kinds = set(handle.prebuilt_masks)
        assert kinds == {"full_attention", "sliding_attention"}  # gemma3 has both
        assert {f"prebuilt-mask:{k}" for k in kinds} <= set(handle.applied)
        full = handle.prebuilt_masks["full_attention"]
        assert isinstance(full, torch.Tensor)
        assert full.shape[-1] == ids.shape[1]
        replayed = _forward(model, ids)
        assert torch.equal(replayed, expected)  # the prebuilt masks are the model's own
        assert (
            modeling.create_causal_mask(config=model.config, inputs_embeds=torch.zeros(1, 3, 4))
            is full
        )  # returned as recorded, whatever is asked
    assert not handle.prebuilt_masks  # undone with the handle
