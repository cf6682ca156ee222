"""The capture-safe cache holds ``window`` slots on sliding layers, ``max_len`` on full
ones, per-layer head shapes, nothing on KV-sharing layers: bytes checked against the formula."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import Gemma4Config

from pypto_capture import DecodeStepRunner
from pypto_models_gemma4 import decode_layout
from pypto_models_gemma4.modeling import PyptoGemma4ForConditionalGeneration
from pypto_testing.gemma4 import GEMMA4_31B_CONFIG, expected_kv_cache_bytes

MAX_LEN = 64


def _prefilled_cache(folder, batch):
    model = PyptoGemma4ForConditionalGeneration.from_pretrained(folder).eval()
    runner = DecodeStepRunner(model, batch_size=batch, max_cache_len=MAX_LEN, backend="eager")
    runner.prefill(torch.randint(3, 250, (batch, 9)))
    return model, runner.cache


@pytest.mark.parametrize(("fixture", "batch"), [("tiny_31b", 2), ("tiny_e2b", 1), ("tiny_moe", 1)])
def test_cache_bytes_match_the_formula(fixture, batch, request):
    folder = request.getfixturevalue(fixture)
    config = json.loads((folder / "config.json").read_text())
    model, cache = _prefilled_cache(folder, batch)
    want = expected_kv_cache_bytes(config, batch=batch, max_cache_len=MAX_LEN, bytes_per_element=4)
    assert cache.nbytes() == want
    layout = decode_layout(model, batch_size=batch, max_cache_len=MAX_LEN, bytes_per_element=4)
    assert layout["total_bytes"] == want
    described = cache.describe()
    assert described["total_bytes"] == want
    assert described["pattern"] == layout["pattern"]
    for got, planned in zip(described["layers"], layout["layers"], strict=True):
        assert got["shared"] == planned["shared"]
        if not got["shared"]:
            for key in ("slots", "kv_heads", "head_dim", "bytes"):
                assert got[key] == planned[key], (got, planned)


def test_the_31b_structure_sliding_window_slots_full_max_len(tiny_31b):
    _, cache = _prefilled_cache(tiny_31b, 2)
    layers = cache.describe()["layers"]
    sliding = [e for e in layers if e["type"] == "sliding_attention"]
    full = [e for e in layers if e["type"] == "full_attention"]
    assert {(e["slots"], e["kv_heads"], e["head_dim"]) for e in sliding} == {(8, 2, 16)}
    assert {(e["slots"], e["kv_heads"], e["head_dim"]) for e in full} == {(MAX_LEN, 1, 32)}
    assert cache.describe()["pattern"] == "5 sliding_attention, 1 full_attention"


def test_kv_sharing_layers_hold_no_buffers(tiny_e2b):
    config = json.loads((tiny_e2b / "config.json").read_text())
    shared = config["text_config"]["num_kv_shared_layers"]
    _, cache = _prefilled_cache(tiny_e2b, 1)
    flags = [e["shared"] for e in cache.describe()["layers"]]
    assert flags == [False] * (len(flags) - shared) + [True] * shared
    assert all(layer.keys is None for layer in cache.layers[-shared:])


def test_the_published_31b_at_8k_context():
    """google/gemma-4-31B-it, batch 1, 8192 tokens, bf16: 50 sliding layers keep 1024 slots."""
    config = Gemma4Config(**copy.deepcopy(GEMMA4_31B_CONFIG))
    layout = decode_layout(config, batch_size=1, max_cache_len=8192, bytes_per_element=2)
    assert layout["pattern"] == "10 x (5 sliding_attention, 1 full_attention)"
    sliding = 50 * 2 * 16 * 1024 * 256 * 2
    full = 10 * 2 * 4 * 8192 * 512 * 2
    assert layout["total_bytes"] == sliding + full == 1_509_949_440  # 1.41 GiB
    # every layer at max_len (what a static cache without rings holds): 4.9x more
    assert layout["static_cache_bytes"] == 50 * 2 * 16 * 8192 * 256 * 2 + full
    assert layout["total_bytes"] == expected_kv_cache_bytes(
        GEMMA4_31B_CONFIG, batch=1, max_cache_len=8192, bytes_per_element=2
    )
