"""Parity with transformers' native Kimi-Linear on the same weights.

The pinned folder (published format, loaded through the preset with remote code on)
against native ``KimiLinearForCausalLM`` loaded from the native folder the weights came
from. Both run the same modules, so fp32 logits agree to rounding and greedy tokens are
equal. Prompts of 14 tokens run the KDA chunked path (prefill) and the recurrent path
(decode); the second row is left-padded.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearForCausalLM

NEW = 16


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
            input_ids=ids,
            attention_mask=am,
            do_sample=False,
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            pad_token_id=0,
        )
    return out[:, ids.shape[1] :]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, kimi):
    import shutil

    from pypto_patch import apply

    folder = tmp_path_factory.mktemp("parity") / "pinned"
    shutil.copytree(kimi[0], folder)
    apply(folder, family="kimi_linear_48b_a3b")
    ours = AutoModelForCausalLM.from_pretrained(
        folder, trust_remote_code=True, local_files_only=True, dtype="float32"
    )
    native = KimiLinearForCausalLM.from_pretrained(kimi[1], dtype=torch.float32).eval()
    assert type(ours) is not KimiLinearForCausalLM
    assert isinstance(ours, KimiLinearForCausalLM)
    return ours, native


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_logits_match_the_native_model(pair, attn):
    ours, native = pair
    ours.config._attn_implementation = native.config._attn_implementation = attn
    ids, am = _prompts()
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=am).logits
        b = native(input_ids=ids, attention_mask=am).logits
    valid = am.bool()
    torch.testing.assert_close(a[valid], b[valid], atol=1e-5, rtol=1e-5)
    assert a[valid].abs().max() > 1.0  # real logits, not a near-zero model


def test_greedy_tokens_equal_the_native_model_for_16_tokens(pair):
    ours, native = pair
    ours.config._attn_implementation = native.config._attn_implementation = "sdpa"
    ids, am = _prompts(seed=1)
    ref = _generate(native, ids, am)
    got = _generate(ours, ids, am)
    assert ref.shape == (2, NEW)
    assert got.tolist() == ref.tolist()
    assert len(set(ref.reshape(-1).tolist())) > 4  # not one token repeated


@pytest.mark.slow  # one inductor compile of the decode step: about a minute on 2 cores
def test_graph_arm_greedy_tokens_equal_native_generate(pair):
    """What pypto-bench's graph arm runs on the pinned class: exact MoE, the capture-safe
    cache (KDA conv + recurrent state, the MLA latent), one compiled decode step replayed."""
    from pypto_capture import DecodeStepRunner, apply_exact_moe

    ours, native = pair
    ours.config._attn_implementation = native.config._attn_implementation = "sdpa"
    ids, am = _prompts(seed=2)
    ref = _generate(native, ids, am)
    torch._dynamo.reset()
    try:
        with (
            apply_exact_moe(ours) as handle,
            DecodeStepRunner(ours, batch_size=2, max_cache_len=32, backend="compile") as runner,
        ):
            assert handle.applied
            got = runner.generate(ids, am, max_new_tokens=NEW)
    finally:
        torch._dynamo.reset()
    assert got.tolist() == ref.tolist()
