"""KV bytes per token for models whose head shapes differ per layer (Gemma 4)."""

from __future__ import annotations

import pytest

from pypto_bench.measure import kv_bytes_per_token

pytest.importorskip("transformers")


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path))


@pytest.mark.parametrize("variant", ["31b", "e2b"])
def test_per_layer_head_shapes_and_kv_sharing_are_summed(tmp_path, variant):
    gemma4 = pytest.importorskip("pypto_testing.gemma4")
    model = _load(gemma4.make_tiny_gemma4(tmp_path / variant, variant))
    cfg = model.config.get_text_config()
    if not hasattr(cfg, "per_layer_config"):
        pytest.skip("this transformers has no heterogeneous per-layer configs")
    holding = cfg.num_hidden_layers - int(cfg.num_kv_shared_layers or 0)
    layers = [cfg.per_layer_config[i] for i in range(holding)]
    want = sum(2 * c.num_key_value_heads * c.head_dim * 4 for c in layers)  # fp32
    assert kv_bytes_per_token(model) == want
    # Not the uniform formula: the full layers are wider and KV-shared layers hold nothing.
    assert len({(c.num_key_value_heads, c.head_dim) for c in layers}) > 1


def test_uniform_models_keep_the_simple_formula(tmp_path):
    from pypto_testing.models import make_tiny_model

    model = _load(make_tiny_model(tmp_path / "llama", "llama"))
    cfg = model.config
    assert kv_bytes_per_token(model) == (
        2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    )


@pytest.mark.parametrize(
    ("value", "want"), [(16, 2 * 16 * 4), ("16", 0), (True, 0), (-16, 0), (float("nan"), 0)]
)
def test_indexer_bytes_count_layers_that_index_and_refuse_a_stranger_s_width(value, want):
    """A DSA config: two layers run their own indexer, one reuses a selection; a width from
    config.json that is not a positive whole number counts nothing and never raises."""
    from transformers import PretrainedConfig

    from pypto_bench.measure import indexer_bytes_per_token

    cfg = PretrainedConfig(
        num_hidden_layers=3,
        layer_types=["indexed_attention"] * 3,
        index_head_dim=value,
        indexer_types=["full", "full", "shared"],
    )
    assert indexer_bytes_per_token(cfg, 4) == want
