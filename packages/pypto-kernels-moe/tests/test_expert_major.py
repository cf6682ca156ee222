"""The expert-major (prefill) path: the device-side grouping, and the kernel on the CPU.

Routings are built to break a wrong grouping: experts hit by many tokens (duplicate
hits), experts with no tokens, and a token count that is not a bucket (padding rows).
"""

from __future__ import annotations

import pytest
import torch
from _moe_fixtures import minimax_m3_experts, qwen3_moe_experts

from pypto_kernels_moe import PACKAGE, grouped_gemm, grouped_gemm_reference, report
from pypto_kernels_moe.ops import EXPERT_MAJOR_MIN_TOKENS
from pypto_kernels_moe.reference import (
    ascending_slots,
    expert_major_grouping,
    expert_major_reference,
)


def skewed_routing(tokens: int, k: int = 2, hidden: int = 64, seed: int = 1):
    """Expert 5 in every token (duplicate hits), the other slot one of 1 / 3 / 6; experts
    0, 2, 4 and 7 get no token."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    other = torch.tensor([1, 3, 6])[torch.randint(0, 3, (tokens,), generator=g)]
    ids = torch.stack([other, torch.full((tokens,), 5)], 1)[:, :k]
    w = torch.softmax(torch.randn(tokens, k, generator=g), -1)
    return x, ids, w


def test_grouping_is_a_stable_counting_sort_with_padding_last():
    x, ids, w = skewed_routing(5)
    ids, w = ascending_slots(ids, w)
    g = expert_major_grouping(x, ids, w, experts=8, padded_tokens=8)
    assert g.xs.shape == (16, 64)  # 8 padded tokens x k 2: fixed by the bucket
    counts = torch.bincount(ids.reshape(-1), minlength=8)
    assert g.offsets.tolist() == [0, *counts.cumsum(0).tolist()]
    assert g.offsets[0] == 0
    assert counts[[0, 2, 4, 7]].sum() == 0
    assert sorted(g.pos.tolist()) == list(range(16))
    for slot, p in enumerate(g.pos[:10].tolist()):  # real rows: the token's x and weight
        t, j = divmod(slot, 2)
        e = int(ids[t, j])
        assert g.offsets[e] <= p < g.offsets[e + 1]
        torch.testing.assert_close(g.xs[p], x[t], rtol=0, atol=0)
        assert g.ws[p, 0] == w[t, j]
    # rows of one expert keep token order (stable)
    rows5 = [p for s, p in enumerate(g.pos[:10].tolist()) if int(ids.reshape(-1)[s]) == 5]
    assert rows5 == sorted(rows5)
    # padding rows sit after every expert's rows, zero, with zero weight
    assert int(g.offsets[-1]) == 10
    assert not g.xs[10:].any()
    assert not g.ws[10:].any()


@pytest.mark.parametrize(("tokens", "padded"), [(5, 8), (9, 16), (1, 1), (33, 64)])
def test_expert_major_reference_equals_the_token_major_one(tokens, padded):
    module = qwen3_moe_experts()
    x, ids, w = skewed_routing(tokens)
    gu, dn = module.gate_up_proj.detach(), module.down_proj.detach()
    want = grouped_gemm_reference(x, ids, w, gu, dn)
    got = expert_major_reference(x, ids, w, gu, dn, padded_tokens=padded)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def _kernel_calls(fn):
    from pypto_kernels_moe import kernels

    before = kernels.expert_major_kernel.cache_info()
    out = fn()
    after = kernels.expert_major_kernel.cache_info()
    return out, (after.hits + after.misses) - (before.hits + before.misses)


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [EXPERT_MAJOR_MIN_TOKENS + 6, EXPERT_MAJOR_MIN_TOKENS * 2])
def test_prefill_runs_expert_major_and_matches_fp32(pypto_cpu, tokens):
    """Not a bucket (padding rows) and a bucket; duplicate hits; experts with no rows."""
    module = qwen3_moe_experts()
    x, ids, w = skewed_routing(tokens)
    PACKAGE.switches.set_switch("grouped_gemm", True)
    with torch.no_grad():
        got, launches = _kernel_calls(
            lambda: grouped_gemm(x, ids, w, module.gate_up_proj, module.down_proj)
        )
        want = grouped_gemm_reference(x, ids, w, module.gate_up_proj, module.down_proj)
    assert launches == 1
    assert report()["calls"]["grouped_gemm"] == {"pypto": 1, "reference": 0}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_decode_sized_calls_stay_token_major(pypto_cpu):
    module = qwen3_moe_experts()
    x, ids, w = skewed_routing(EXPERT_MAJOR_MIN_TOKENS - 1)
    PACKAGE.switches.set_switch("grouped_gemm", True)
    with torch.no_grad():
        got, launches = _kernel_calls(
            lambda: grouped_gemm(x, ids, w, module.gate_up_proj, module.down_proj)
        )
    assert launches == 0
    want = grouped_gemm_reference(x, ids, w, module.gate_up_proj, module.down_proj)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_prefill_clamped_swiglu(pypto_cpu):
    module = minimax_m3_experts()
    x, ids, w = skewed_routing(EXPERT_MAJOR_MIN_TOKENS)
    x = x * 3.0  # hit the clamps
    PACKAGE.switches.set_switch("grouped_gemm", True)
    args = (x, ids, w, module.gate_up_proj, module.down_proj, "swigluoai", 1.702, 7.0)
    with torch.no_grad():
        got = grouped_gemm(*args)
        want = grouped_gemm_reference(*args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
