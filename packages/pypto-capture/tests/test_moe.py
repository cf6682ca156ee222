"""Static MoE routing on a plain module: tables, equivalence, and capture with fullgraph."""

from __future__ import annotations

import pytest
import torch

from pypto_capture import CaptureFailedError, StaticMoERouting, capture_and_replay


class TinyMoE(torch.nn.Module):
    """Data-dependent routing as MoE blocks write it: topk, then per-expert selection."""

    def __init__(self, hidden=8, experts=4, top_k=2):
        super().__init__()
        torch.manual_seed(0)
        self.top_k = top_k
        self.gate = torch.nn.Linear(hidden, experts, bias=False)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(experts))

    def forward(self, x):
        logits = self.gate(x)
        w, ids = torch.topk(torch.softmax(logits, -1), self.top_k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.where(ids == e)  # data-dependent shape
            if tok.numel() == 0:  # host sync + Python branch
                continue
            out.index_add_(0, tok, expert(x[tok]) * w[tok, slot, None])
        return out

    def static_forward(self, x, routing):
        return routing(x, self.gate(x), self.experts)


def test_tables_are_counts_and_exclusive_cumsum():
    r = StaticMoERouting.round_robin(num_tokens=5, top_k=2, num_experts=3)
    flat = r.expert_ids.reshape(-1).tolist()
    assert r.counts.tolist() == [flat.count(e) for e in range(3)]
    assert r.offsets.tolist()[0] == 0
    assert r.offsets.tolist()[1:] == torch.cumsum(r.counts, 0).tolist()
    assert r.host_offsets == r.offsets.tolist()
    grouped = r.expert_ids.reshape(-1)[r.order]
    assert grouped.tolist() == sorted(flat)  # order groups the pairs by expert
    assert all(len(set(row)) == 2 for row in r.expert_ids.tolist())  # distinct experts per token


def test_frozen_router_choice_reproduces_dynamic_routing():
    moe = TinyMoE()
    x = torch.randn(6, 8)
    with torch.no_grad():
        routing = StaticMoERouting.from_router_logits(moe.gate(x), top_k=2)
        assert torch.allclose(moe.static_forward(x, routing), moe(x), atol=1e-6)


def test_dynamic_routing_fails_capture_static_routing_captures():
    moe = TinyMoE()
    x = torch.randn(6, 8)
    with pytest.raises(CaptureFailedError) as exc, torch.no_grad():
        capture_and_replay(lambda: moe(x), warmup=1, replays=1, backend="compile", device="cpu")
    assert exc.value.explanation.matched

    routing = StaticMoERouting.round_robin(6, 2, 4)
    with torch.no_grad():
        ref = moe.static_forward(x, routing)
        res = capture_and_replay(
            lambda: moe.static_forward(x, routing),
            warmup=1,
            replays=2,
            backend="compile",
            device="cpu",
        )
    assert torch.allclose(res.output, ref, atol=1e-5)
    assert len(res.times_s) == 2


def test_bad_tables_rejected():
    from pypto_capture import PyptoCaptureError

    with pytest.raises(PyptoCaptureError):
        StaticMoERouting(torch.tensor([[0, 5]]), num_experts=4)
    with pytest.raises(PyptoCaptureError):
        StaticMoERouting.round_robin(2, 5, 4)
