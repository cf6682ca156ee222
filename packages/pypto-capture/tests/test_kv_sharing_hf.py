"""The capture-safe cache on layers that share keys/values and on prefill caches that do
not report their sliding windows (both Gemma 4 shapes, on transformers 5.8 and 5.24)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
models = pytest.importorskip("pypto_testing.models")
gemma4 = pytest.importorskip("pypto_testing.gemma4")

import inspect  # noqa: E402

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, DynamicCache  # noqa: E402

from pypto_capture import (  # noqa: E402
    DecodeStepRunner,
    UnsupportedModelError,
    make_capture_safe_cache,
)

MAX_LEN = 48


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    path = models.make_tiny_model(tmp_path_factory.mktemp("g3") / "gemma3", "gemma3")
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def e2b_dir(tmp_path_factory):
    """Per-layer embeddings and 3 trailing layers that reuse earlier layers' keys/values."""
    return gemma4.make_tiny_gemma4(tmp_path_factory.mktemp("g4") / "e2b", "e2b")


def test_windows_come_from_the_config_when_the_prefill_cache_has_none(gemma3):
    """transformers 5.8 prefills Gemma 4 into plain full layers: the ring must still be a window."""
    ids = torch.randint(3, 250, (1, 12))
    # 5.24 names the kwarg "cache", earlier 5.x "past_key_values"
    kwarg = (
        "cache" if "cache" in inspect.signature(gemma3.forward).parameters else "past_key_values"
    )
    with torch.no_grad():  # a DynamicCache without a config: no windows on its layers
        out = gemma3(input_ids=ids, use_cache=True, **{kwarg: DynamicCache()})
    prefilled = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    assert all(getattr(layer, "sliding_window", None) is None for layer in prefilled.layers)
    cache = make_capture_safe_cache(
        gemma3, batch_size=1, max_cache_len=MAX_LEN, device=torch.device("cpu"), prefilled=prefilled
    )
    assert [layer.max_cache_len for layer in cache.layers] == [8, MAX_LEN]


def test_kv_sharing_layers_get_no_ring_and_decode_equals_generate(e2b_dir):
    model = AutoModelForCausalLM.from_pretrained(e2b_dir).eval()
    model.generation_config.eos_token_id = None
    ids = torch.randint(3, 250, (2, 9), generator=torch.Generator().manual_seed(0))
    am = torch.ones_like(ids)
    ids[1, :2] = 0
    am[1, :2] = 0
    want = model.generate(
        ids, attention_mask=am, do_sample=False, max_new_tokens=30, pad_token_id=0
    )
    runner = DecodeStepRunner(model, batch_size=2, max_cache_len=MAX_LEN, backend="eager")
    got = runner.generate(ids, am, max_new_tokens=30)
    assert got.tolist() == want[:, 9:].tolist()
    shared = model.config.get_text_config().num_kv_shared_layers
    flags = [entry["shared"] for entry in runner.cache.describe()["layers"]]
    assert flags == [False] * (len(flags) - shared) + [True] * shared
    assert runner.cache.nbytes() == sum(layer.nbytes() for layer in runner.cache.layers[:-shared])


def test_the_config_alone_marks_kv_sharing_layers(e2b_dir):
    model = AutoModelForCausalLM.from_pretrained(e2b_dir).eval()
    cache = make_capture_safe_cache(
        model, batch_size=1, max_cache_len=MAX_LEN, device=torch.device("cpu")
    )
    shared = model.config.get_text_config().num_kv_shared_layers
    assert [not layer.holds_cache for layer in cache.layers][-shared - 1 :] == [False] + [
        True
    ] * shared
    with pytest.raises(UnsupportedModelError, match="shares another layer's keys/values"):
        cache.layers[-1].update(torch.zeros(1, 1, 1, 16), torch.zeros(1, 1, 1, 16))


def test_describe_names_the_pattern_and_per_layer_sizes(gemma3):
    runner = DecodeStepRunner(gemma3, batch_size=2, max_cache_len=MAX_LEN, backend="eager")
    runner.prefill(torch.randint(3, 250, (2, 5)))
    info = runner.cache.describe()
    assert info["pattern"] == "1 sliding_attention, 1 full_attention"
    assert info["slots_per_type"] == {"sliding_attention": 8, "full_attention": MAX_LEN}
    sliding, full = info["layers"]
    # [B, kv_heads, slots, head_dim] x K and V x fp32
    assert sliding["bytes"] == 2 * 2 * 2 * 8 * 16 * 4
    assert full["bytes"] == 2 * 2 * 2 * MAX_LEN * 16 * 4
    assert info["total_bytes"] == runner.cache.nbytes() == sliding["bytes"] + full["bytes"]
