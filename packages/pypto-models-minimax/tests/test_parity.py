"""Parity with transformers' native models on the same weights, eager and captured.

M2.7 against native ``MiniMaxM2ForCausalLM`` loaded from a float32 folder holding what the
FP8 checkpoint means; M3 against native ``MiniMaxM3SparseForConditionalGeneration`` loaded
from the VL folder itself. The prompts (14 tokens) exceed what M3's tiny indexer keeps
(2 blocks of 4 + the local one), so its block selection really drops keys.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

from pypto_capture import DecodeStepRunner, apply_exact_moe
from pypto_models_minimax.modeling import PyptoMiniMaxM3ForCausalLM, PyptoMiniMaxM27ForCausalLM

NEW = 10
MAX_LEN = 32


def _prompts(batch=2, length=14, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (batch, length), generator=g)
    am = torch.ones_like(ids)
    if batch > 1:
        ids[1, :4] = 0  # left padding on the second row
        am[1, :4] = 0
    return ids, am


def _generate(model, ids, am):
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=am, do_sample=False, max_new_tokens=NEW, pad_token_id=0
        )
    return out[:, ids.shape[1] :]


def _same_until_eos(got, ref):
    for b in range(ref.shape[0]):
        row = ref[b].tolist()
        n = row.index(2) + 1 if 2 in row else len(row)
        assert got[b, :n].tolist() == row[:n], f"row {b}:\n{got[b].tolist()}\n{row}"


@pytest.fixture(scope="module")
def m27_pair(m27_fp8):
    folder, reference = m27_fp8
    ours = PyptoMiniMaxM27ForCausalLM.from_pretrained(
        folder, dtype="float32", attn_implementation="eager"
    )
    native = AutoModelForCausalLM.from_pretrained(reference, attn_implementation="eager").eval()
    return ours, native


@pytest.fixture(scope="module")
def m3_pair(m3):
    ours = PyptoMiniMaxM3ForCausalLM.from_pretrained(
        m3, dtype="float32", attn_implementation="eager"
    )
    native = AutoModelForImageTextToText.from_pretrained(
        m3, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return ours, native


@pytest.mark.parametrize("pair", ["m27_pair", "m3_pair"])
def test_logits_match_the_native_model(request, pair):
    ours, native = request.getfixturevalue(pair)
    ids, am = _prompts()
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=am).logits
        b = native(input_ids=ids, attention_mask=am).logits
    valid = am.bool()
    torch.testing.assert_close(a[valid], b[valid], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pair", ["m27_pair", "m3_pair"])
def test_eager_generate_matches_the_native_model(request, pair):
    ours, native = request.getfixturevalue(pair)
    ids, am = _prompts(seed=1)
    ref = _generate(native, ids, am)
    _same_until_eos(_generate(ours, ids, am), ref)
    assert len(set(ref.reshape(-1).tolist())) > 3


@pytest.mark.parametrize("pair", ["m27_pair", "m3_pair"])
def test_graph_arm_greedy_tokens_equal_native_generate(request, pair):
    """What pypto-bench's graph arm runs: exact MoE, the capture-safe cache, one compiled
    (fullgraph, static shapes) decode step replayed; against native eager generate."""
    ours, native = request.getfixturevalue(pair)
    ids, am = _prompts(seed=2)
    ref = _generate(native, ids, am)
    with (
        apply_exact_moe(ours) as handle,
        DecodeStepRunner(ours, batch_size=2, max_cache_len=MAX_LEN, backend="compile") as runner,
    ):
        assert handle.applied
        got = runner.generate(ids, am, max_new_tokens=NEW)
    _same_until_eos(got, ref)


def test_m3_index_keys_ride_in_the_cache_as_one_extra_key_head(m3_pair):
    ours, _ = m3_pair
    ids, am = _prompts(batch=1)
    with torch.no_grad():
        out = ours(input_ids=ids, attention_mask=am, use_cache=True)
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    kv_heads = ours.config.num_key_value_heads
    types = ours.config.layer_types
    for i, layer in enumerate(cache.layers):
        extra = 1 if types[i] == "minimax_m3_sparse" else 0
        assert layer.keys.shape[1] == kv_heads + extra, i
        assert layer.values.shape[1] == kv_heads


def test_m3_sparse_selection_drops_blocks_on_these_prompts(m3_pair):
    """Guard for the parity tests above: the indexer must actually mask some keys."""
    ours, _ = m3_pair
    ids, _ = _prompts(batch=1)
    indexer = ours.model.layers[1].self_attn.indexer
    original = indexer.build_block_mask
    captured = {}

    def spy(*args, **kwargs):
        captured["mask"] = original(*args, **kwargs)
        return captured["mask"]

    indexer.build_block_mask = spy
    try:
        with torch.no_grad():
            ours(input_ids=ids)
    finally:
        del indexer.build_block_mask
    mask = captured["mask"]  # [B, heads, Sq, Sk] additive
    causal = torch.ones(ids.shape[1], ids.shape[1]).tril().bool()
    assert ((mask[0, 0] < 0) & causal).any(), "the indexer kept every key: prompt too short"
