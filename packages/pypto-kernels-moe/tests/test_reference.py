"""The reference equals transformers' own experts loop (bmm vs linear: fp32 rounding only)."""

from __future__ import annotations

import pytest
import torch
from _moe_fixtures import gemma4_experts, minimax_m3_experts, qwen3_moe_experts, routing

from pypto_kernels_moe import activation_of, ascending_slots, grouped_gemm_reference
from pypto_kernels_moe.reference import gather_chunk


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


class _CountIndexSelect(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.index_select.default:
            self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_large_call_gathers_in_chunks_and_computes_the_same_numbers(dtype):
    module = qwen3_moe_experts().to(dtype)
    x, ids, w = routing(9, 4, 8, 64)
    x, w = x.to(dtype), w.to(dtype)
    gu, dn = module.gate_up_proj, module.down_proj
    per_row = (gu[0].numel() + dn[0].numel()) * gu.element_size()
    with torch.no_grad():
        whole = grouped_gemm_reference(x, ids, w, gu, dn)
        with _CountIndexSelect() as count:
            # 5 rows per chunk: 36 (token, slot) rows in 8 chunks, splitting tokens.
            chunked = grouped_gemm_reference(x, ids, w, gu, dn, max_gather_bytes=5 * per_row)
        assert count.calls == 2 * 8
        # Rows are independent: fp32 rounding at most (bmm blocks by its batch size).
        torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-7)
        torch.testing.assert_close(
            chunked, module(x, ids, w), rtol=1e-5, atol=1e-6 if dtype == torch.float32 else 2e-2
        )
        with _CountIndexSelect() as count:
            grouped_gemm_reference(x, ids, w, gu, dn, max_gather_bytes=36 * per_row)
        assert count.calls == 2  # everything fits: one gather each


def test_gather_chunk_bounds_the_bytes_and_keeps_a_traced_call_whole():
    gu, dn = torch.empty(4, 6, 8), torch.empty(4, 8, 3)  # 48 + 24 floats: 288 bytes a row
    assert gather_chunk(10, gu, dn, 288 * 10) is None
    assert gather_chunk(11, gu, dn, 288 * 10) == 10
    assert gather_chunk(11, gu, dn, 1) == 1  # never zero rows
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    module = qwen3_moe_experts()
    x, ids, w = routing(9, 4, 8, 64)
    fn = torch.compile(
        lambda x, ids, w: grouped_gemm_reference(
            x, ids, w, module.gate_up_proj, module.down_proj, max_gather_bytes=1
        ),
        backend=backend,
        dynamic=True,
        fullgraph=True,
    )
    with torch.no_grad():
        torch.testing.assert_close(
            fn(x, ids, w), grouped_gemm_reference(x, ids, w, module.gate_up_proj, module.down_proj)
        )
    (gm,) = graphs
    selects = [
        n
        for n in gm.graph.nodes
        if n.target is torch.index_select or "index_select" in str(n.target)
    ]
    assert len(selects) == 2  # traced: one fixed-shape gather each, whatever the budget
