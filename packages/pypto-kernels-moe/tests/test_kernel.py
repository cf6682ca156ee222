"""The PyPTO grouped GEMM on the CPU (SIM + verify shim) against the reference."""

from __future__ import annotations

import pytest
import torch
from _moe_fixtures import gemma4_experts, minimax_m3_experts, qwen3_moe_experts, routing

from pypto_kernels_moe import PACKAGE, grouped_gemm, grouped_gemm_reference, report

pytestmark = pytest.mark.slow


def _run(module, x, ids, w, *act):
    PACKAGE.switches.set_switch("grouped_gemm", True)
    with torch.no_grad():
        got = grouped_gemm(x, ids, w, module.gate_up_proj, module.down_proj, *act)
        want = grouped_gemm_reference(x, ids, w, module.gate_up_proj, module.down_proj, *act)
    calls = report()["calls"]["grouped_gemm"]
    assert calls == {"pypto": 1, "reference": 0}, report()
    return got, want


@pytest.mark.parametrize("tokens", [1, 3])
def test_decode_silu_fp32(pypto_cpu, tokens):
    module = qwen3_moe_experts()
    x, ids, w = routing(tokens, 4, 8, 64)
    got, want = _run(module, x, ids, w)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_decode_silu_bf16_int64_ids(pypto_cpu):
    module = qwen3_moe_experts().to(torch.bfloat16)
    x, ids, w = routing(2, 2, 8, 64)
    got, want = _run(module, x.bfloat16(), ids, w)  # fp32 routing weights, bf16 hidden
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_clamped_swiglu_hits_the_clamp(pypto_cpu):
    module = minimax_m3_experts()
    x, ids, w = routing(2, 2, 8, 64, scale=3.0)
    got, want = _run(module, x, ids, w, "swigluoai", 1.702, 7.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_gelu_tanh_gemma4_experts(pypto_cpu):
    module = gemma4_experts()
    x, ids, w = routing(2, 2, 8, 64)
    got, want = _run(module, x, ids, w, "gelu_tanh")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_prefill_token_count_reuses_the_kernel(pypto_cpu):
    """Token count is a dynamic axis: a 16-token call runs the same compiled kernel."""
    from pypto_kernels_moe import kernels

    module = qwen3_moe_experts()
    x, ids, w = routing(16, 2, 8, 64)
    got, want = _run(module, x, ids, w)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    before = kernels.grouped_gemm_kernel.cache_info().currsize
    x, ids, w = routing(5, 2, 8, 64, seed=3)
    with torch.no_grad():
        grouped_gemm(x, ids, w, module.gate_up_proj, module.down_proj)
    assert kernels.grouped_gemm_kernel.cache_info().currsize == before


def test_top8_two_tokens_sum_their_own_slots(pypto_cpu):
    """Each (token, slot) iteration writes its own scratch row and the second pass adds
    a token's 8 rows in ascending expert id: two tokens, every expert hit by both."""
    module = qwen3_moe_experts()
    x, ids, w = routing(2, 8, 8, 64)
    got, want = _run(module, x, ids, w)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slot_loop_equals_token_loop_bit_for_bit(pypto_cpu, dtype):
    """The NPU's (token, slot) loop and the CPU's per-token loop are one computation.

    The CPU path runs the per-token loop (the precision tool's memory grows with loop
    iterations, kernels.slot_loop); this runs both through the same SIM + verify and
    requires identical bits, so the precision suite's verdict holds for the loop the
    NPU and the cost model run.
    """
    from pypto_kernels_moe import kernels
    from pypto_kernels_moe.reference import ascending_slots

    module = qwen3_moe_experts().to(dtype)
    x, ids, w = routing(3, 4, 8, 64)
    ids, w = ascending_slots(ids, w)
    x = x.to(dtype)
    outs = []
    for slots in (True, False):
        kern = kernels.grouped_gemm_kernel(
            pypto_cpu, 4, 64, 32, 8, dtype, tiles=kernels.grouped_tiles(dtype), slots=slots
        )
        out = torch.empty_like(x)
        with torch.no_grad():
            kern(
                x,
                ids.to(torch.int32).contiguous(),
                w.float().contiguous(),
                module.gate_up_proj.detach().contiguous(),
                module.down_proj.detach().contiguous(),
                torch.empty(3, 4 * 64, dtype=dtype),
                out,
            )
        outs.append(out)
    assert not kernels.slot_loop(pypto_cpu)
    assert outs[0].abs().sum() > 0
    assert torch.equal(outs[0], outs[1])
