"""The torch reference and the device-side visibility rule (pypto-capture's ring layout)."""

from __future__ import annotations

import torch

from pypto_kernels_attention import reference


def test_full_layer_sees_slots_below_the_valid_length():
    valid = reference.ring_valid(torch.tensor([3, 5]), 6)
    assert valid.tolist() == [[True] * 3 + [False] * 3, [True] * 5 + [False]]


def test_sliding_ring_matches_pypto_capture_decode_masks():
    """The same rule as CaptureSafeCache.decode_masks: slot k holds c - ((c - k) mod L)."""
    slots = 4
    for length in range(1, 12):
        c = length - 1
        want = [c - ((c - k) % slots) >= 0 for k in range(slots)]
        got = reference.ring_valid(torch.tensor([length]), slots, window=slots)[0].tolist()
        assert got == want, length


def test_sliding_window_hides_positions_older_than_the_window():
    # A cache with more slots than the window (not pypto-capture's layout, which sizes a
    # sliding ring to the window) must still hide what the window excludes.
    got = reference.ring_valid(torch.tensor([6]), 8, window=3)[0].tolist()
    assert got == [False, False, False, True, True, True, False, False]


def test_reference_equals_transformers_eager_attention():
    from transformers.models.gemma4.modeling_gemma4 import eager_attention_forward

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    bias = reference.valid_bias(torch.tensor([4, 9]), 9)

    class M(torch.nn.Module):
        num_key_value_groups = 2
        head_dim = 16

    want, _ = eager_attention_forward(M().eval(), q, k, v, bias[:, None, None, :], scaling=0.3)
    got = reference.gqa_decode_reference(q, k, v, bias, 0.3)
    torch.testing.assert_close(got, want.transpose(1, 2), rtol=0, atol=1e-6)
    capped, _ = eager_attention_forward(M().eval(), q, k, v, bias[:, None, None, :], 0.0, 0.3, 5.0)
    torch.testing.assert_close(
        reference.gqa_decode_reference(q, k, v, bias, 0.3, 5.0), capped.transpose(1, 2)
    )
