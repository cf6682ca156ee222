"""The ``indexed`` cache layer kind: sparse-attention indexer keys beside the K/V ring.

Unit-level (no model run): where a step's indexer keys land, what a prefill hands over,
what is refused, and the bytes counted before allocation. The decode proofs on real
GLM-MoE-DSA / HY-V4 folders are pypto-bench's test_sparse_attention.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch

from pypto_capture import UnsupportedModelError
from pypto_capture.cache import (
    capture_safe_cache_class,
    layer_kinds_of,
    static_cache_bytes,
)

B, L, D = 2, 8, 4


def _cache(kinds):
    cls = capture_safe_cache_class()
    return cls(
        batch_size=B,
        max_cache_len=L,
        windows=[None] * len(kinds),
        layer_types=["indexed_attention"] * len(kinds),
        device=torch.device("cpu"),
        kinds=kinds,
    )


class _Prefilled:
    """What transformers' DynamicIndexedLayer holds after a prompt of ``p`` tokens."""

    def __init__(self, p, indexer=True, positions=None):
        self.keys = torch.randn(B, 1, p, 6)
        self.values = torch.randn(B, 1, p, 3)
        self.indexer_keys = torch.randn(B, p, D) if indexer else None
        self.indexer_position_ids = positions


class _Cache:
    def __init__(self, layers):
        self.layers = layers


def test_prefill_keys_land_in_their_slots_and_a_step_writes_at_the_position():
    cache = _cache(["indexed", "attention"])
    src = [_Prefilled(5), _Prefilled(5, indexer=False)]
    cache.load_prefill(_Cache(src), torch.ones(B, 5, dtype=torch.long))
    layer = cache.layers[0]
    assert torch.equal(layer.indexer_keys[:, :5], src[0].indexer_keys)
    assert not layer.indexer_keys[:, 5:].any()
    step = torch.randn(B, 1, D)
    out = cache.update_indexer(step, 0)
    assert out is layer.indexer_keys  # the whole static buffer, every slot
    assert out.shape == (B, L, D)
    assert torch.equal(out[:, 5:6], step)
    cache.advance()
    cache.update_indexer(step * 2, 0)
    assert torch.equal(layer.indexer_keys[:, 6:7], step * 2)
    # the buffer travels with the state a capture snapshots and restores
    assert any(t is layer.indexer_keys for t in cache.state_tensors())
    described = cache.describe()
    assert described["layers"][0]["indexer_bytes"] == B * L * D * 4
    assert described["layers"][0]["index_head_dim"] == D
    assert "indexer_bytes" not in described["layers"][1]
    assert described["indexer_bytes"] == B * L * D * 4
    assert described["total_bytes"] == described["kv_bytes"] + B * L * D * 4


def test_a_layer_without_an_indexer_refuses_update_indexer():
    cache = _cache(["attention"])
    cache.load_prefill(_Cache([_Prefilled(3, indexer=False)]), torch.ones(B, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="update_indexer"):
        cache.update_indexer(torch.randn(B, 1, D), 0)


def test_a_growing_indexer_position_history_is_refused_in_one_line():
    cache = _cache(["indexed"])
    src = _Prefilled(3, positions=torch.zeros(3, B, 3, dtype=torch.long))
    with pytest.raises(UnsupportedModelError) as info:
        cache.load_prefill(_Cache([src]), torch.ones(B, 3, dtype=torch.long))
    assert "indexer_position_ids" in str(info.value)
    assert "\n" not in str(info.value)


def test_prefill_without_indexer_keys_is_refused():
    cache = _cache(["indexed"])
    src = _Prefilled(3)
    src.indexer_keys = torch.randn(B, 3)  # not [B, S, D]
    with pytest.raises(UnsupportedModelError, match="indexer keys"):
        cache.load_prefill(_Cache([src]), torch.ones(B, 3, dtype=torch.long))


def test_kinds_read_off_the_prefill_cache():
    layers = [_Prefilled(3), _Prefilled(3, indexer=False), _Prefilled(3, positions=torch.ones(1))]
    layers[2].indexer_keys = None
    assert layer_kinds_of(_Cache(layers), [False] * 3) == ["indexed", "attention", "indexed"]


def test_static_bytes_count_the_indexer_keys_of_layers_that_index():
    from transformers import PretrainedConfig

    base = dict(
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=4,
        hidden_size=8,
        layer_types=["indexed_attention"] * 3,
    )
    plain = static_cache_bytes(PretrainedConfig(**base), batch_size=B, max_cache_len=L)
    dsa = PretrainedConfig(**base, index_head_dim=D, indexer_types=["full", "full", "shared"])
    got = static_cache_bytes(dsa, batch_size=B, max_cache_len=L)
    assert got - plain == 2 * B * L * D * 4  # two layers run their own indexer, fp32
    no_types = PretrainedConfig(**base, index_head_dim=D)
    assert static_cache_bytes(no_types, batch_size=B, max_cache_len=L) - plain == 3 * B * L * D * 4


@pytest.mark.parametrize(
    ("value", "types"),
    [
        ("16", ["full"] * 3),  # a string
        (True, ["full"] * 3),  # a bool is not a width
        (-4, ["full"] * 3),
        (float("nan"), ["full"] * 3),
        (D, "full"),  # indexer types not a list: the layer types decide (none indexed here)
        (D, ["full"]),  # fewer entries than layers: the layer types decide
    ],
)
def test_a_stranger_s_indexer_config_counts_no_bytes_it_does_not_prove(value, types):
    """config.json is a stranger's file: an index_head_dim that is not a positive whole
    number, or indexer types of the wrong shape, mark no layer (and never raise)."""
    from transformers import PretrainedConfig

    from pypto_capture import indexer_layers

    types_ = ["full_attention"] * 3
    cfg = PretrainedConfig(
        num_hidden_layers=3, layer_types=types_, index_head_dim=value, indexer_types=types
    )
    assert indexer_layers(cfg, types_) == [False] * 3
    assert static_cache_bytes(cfg, batch_size=B, max_cache_len=L) == static_cache_bytes(
        PretrainedConfig(num_hidden_layers=3, layer_types=types_), batch_size=B, max_cache_len=L
    )


def test_a_cache_api_the_layer_lacks_is_refused_in_one_line_and_probes_stay_false():
    """DeepSeek-V4 calls `store_compression_weights` on its cache layer: a refusal naming
    it (an UnsupportedModelError), still an AttributeError for a model that only asks
    hasattr(); the layer's own not-yet-written state stays a plain AttributeError."""
    from pypto_capture import CacheApiNotSupportedError, UnsupportedModelError

    layer = _cache(["attention"]).layers[0]
    with pytest.raises(
        CacheApiNotSupportedError, match="calls `store_compression_weights`"
    ) as info:
        layer.store_compression_weights(torch.zeros(1))
    assert isinstance(info.value, UnsupportedModelError)
    assert isinstance(info.value, AttributeError)
    assert "\n" not in str(info.value)
    assert not hasattr(layer, "store_compression_weights")
    assert getattr(layer, "compressed_keys", None) is None
    with pytest.raises(AttributeError) as plain:
        layer.__deepcopy_hook__  # noqa: B018 - a private name: a plain AttributeError
    assert not isinstance(plain.value, CacheApiNotSupportedError)


def test_a_refusal_raised_inside_a_compiled_step_stays_a_one_line_refusal():
    """Under the compile backend dynamo wraps what the traced step raised ("Observed
    exception" around a repr of it): the zoo's DeepSeek-V4 then read "CaptureFailedError
    [CacheApiNotSupportedError: ...]" with the compile backend and a plain refusal with the
    eager one. The backend hands back the refusal itself, whole, whichever backend ran."""
    from pypto_capture import CacheApiNotSupportedError, CaptureFailedError, make_backend

    layer = _cache(["attention"]).layers[0]
    x = torch.zeros(2)

    def step():
        layer.store_compression_weights(x)
        return x + 1

    for name in ("compile", "eager"):
        with pytest.raises(CacheApiNotSupportedError) as info:
            make_backend(name, "cpu").capture(step, warmup=1).replay()  # eager: at replay
        assert not isinstance(info.value, CaptureFailedError)
        message = str(info.value)
        assert message.startswith("the model calls `store_compression_weights`"), message
        assert "\n" not in message
        assert not message.endswith("...")  # whole, not the explanation's clipped copy
