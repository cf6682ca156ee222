"""Where a ring slot's key sits in the sequence, for models that read positions off the cache.

Sliding layers keep a ring: slot order is not sequence order once the window wraps. Rotary
embeddings do not care (applied before caching), but Inkling's relative-position bias is
computed from ``arange(kv_length) + kv_offset`` (``cache.get_mask_sizes``): with the ring's
slots read as positions in order, Inkling-2's graph arm matched eager at 6% of tokens
(issue #44). ``get_mask_sizes`` of a sliding layer gives a per-slot offset, so each slot
reads as its own position.
"""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("transformers")

import torch

from pypto_capture import DecodeStepRunner, apply_exact_moe
from pypto_capture.cache import capture_safe_cache_class


def test_a_sliding_ring_reports_each_slot_s_position():
    cls = capture_safe_cache_class()
    cache = cls(
        batch_size=1,
        max_cache_len=32,
        windows=[4, None],
        layer_types=["sliding_attention", "full_attention"],
        device=torch.device("cpu"),
    )
    cache.write_pos.fill_(9)  # the token at position 9 is written to slot 9 % 4 = 1
    n, offset = cache.get_mask_sizes(1, 0)
    assert n == 4
    assert (torch.arange(n) + offset).tolist() == [8, 9, 6, 7]
    cache.write_pos.fill_(2)  # not wrapped yet: slot 3 holds nothing (position -1, masked)
    n, offset = cache.get_mask_sizes(1, 0)
    assert (torch.arange(n) + offset).tolist() == [0, 1, 2, -1]
    assert cache.get_mask_sizes(1, 1) == (32, 0)  # a full layer's ring never wraps


_INKLING2 = dict(
    vocab_size=259,
    unpadded_vocab_size=259,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    swa_num_attention_heads=4,
    swa_num_key_value_heads=2,
    swa_head_dim=16,
    sliding_window_size=6,  # 8 prompt + 12 new tokens: the ring wraps three times
    d_rel=4,
    rel_extent=16,
    moe_intermediate_size=32,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_layers_per_attn_res_block=1,
    layer_types=["hybrid_sliding", "hybrid"],
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    max_position_embeddings=256,
)


@pytest.mark.parametrize(
    ("model_type", "backend"),
    [("inkling2_text", "compile"), ("inkling2_loop_text", "eager")],
)
def test_inkling2_decodes_past_its_window_with_eager_s_tokens(model_type, backend):
    """The relative-position bias past the window: greedy tokens equal generate's and each
    step's teacher-forced logits eager's (the captured step for Inkling-2, the same
    fixed-shape step uncaptured for its loop variant)."""
    if importlib.util.find_spec(f"transformers.models.{model_type.removesuffix('_text')}") is None:
        pytest.skip(f"this transformers has no {model_type}")
    from transformers import AutoConfig, AutoModelForCausalLM

    torch._dynamo.reset()
    config = AutoConfig.for_model(model_type, **_INKLING2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # wider than the init: distinct greedy tokens
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "norm" not in name:
                p.normal_(0.0, 0.2)
    ids = torch.randint(3, 259, (1, 8), generator=torch.Generator().manual_seed(1))
    am = torch.ones_like(ids)
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=am, max_new_tokens=12, do_sample=False)[:, 8:]
        # eager's own logits over the prompt and its tokens (teacher forcing), step 0 the
        # prompt's last position
        full = torch.cat([ids, ref[:, :-1]], dim=1)
        want = model(input_ids=full, attention_mask=torch.ones_like(full)).logits[:, 7:]
    with (
        apply_exact_moe(model),
        DecodeStepRunner(model, batch_size=1, max_cache_len=32, backend=backend) as runner,
    ):
        got = runner.generate(ids, am, max_new_tokens=12)
        logits = runner.forced_logits(ids, am, ref)
    assert torch.equal(got.cpu(), ref), (got.tolist(), ref.tolist())
    # Not only the argmax: every step's logits, fed eager's tokens, are eager's (fp32; the
    # captured step differs by reduction order only).
    torch.testing.assert_close(logits.cpu(), want, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
