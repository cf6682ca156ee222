"""The reference equals transformers' own experts loop (bmm vs linear: fp32 rounding only)."""

from __future__ import annotations

import pytest
import torch
from _moe_fixtures import gemma4_experts, minimax_m3_experts, qwen3_moe_experts, routing

from pypto_kernels_moe import activation_of, ascending_slots, grouped_gemm_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 3, 9])
def test_reference_matches_qwen3_moe_native_loop(dtype, tokens):
    module = qwen3_moe_experts().to(dtype)
    x, ids, w = routing(tokens, 4, 8, 64)
    x, w = x.to(dtype), w.to(dtype)
    with torch.no_grad():
        want = module(x, ids, w)
        got = grouped_gemm_reference(x, ids, w, module.gate_up_proj, module.down_proj)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 if dtype == torch.float32 else 2e-2)


def test_reference_matches_minimax_m3_clamped_swiglu():
    module = minimax_m3_experts()
    x, ids, w = routing(5, 2, 8, 64, scale=3.0)
    act = activation_of(module)
    assert act == ("swigluoai", 1.702, 7.0)
    with torch.no_grad():
        gu = torch.nn.functional.linear(x, module.gate_up_proj[0])
        assert (gu > 7).any(), "the clamp is not exercised"
        want = module(x, ids, w)
        got = grouped_gemm_reference(x, ids, w, module.gate_up_proj, module.down_proj, *act)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_ascending_slots_sorts_ids_and_weights_together():
    ids = torch.tensor([[5, 1, 3], [0, 7, 2]])
    w = torch.tensor([[0.5, 0.1, 0.3], [0.0, 0.7, 0.2]])
    s_ids, s_w = ascending_slots(ids, w)
    assert s_ids.tolist() == [[1, 3, 5], [0, 2, 7]]
    torch.testing.assert_close(s_w, torch.tensor([[0.1, 0.3, 0.5], [0.0, 0.2, 0.7]]))


def test_reference_matches_gemma4_gelu_tanh_experts():
    module = gemma4_experts()
    x, ids, w = routing(4, 2, 8, 64)
    act = activation_of(module)
    assert act is not None
    assert act[0] == "gelu_tanh"
    with torch.no_grad():
        want = module(x, ids, w)
        got = grouped_gemm_reference(x, ids, w, module.gate_up_proj, module.down_proj, *act)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
