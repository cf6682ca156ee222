"""Static MoE routing: fixed top-k assignment with routing tables built before capture.

Data-dependent expert routing (topk -> argsort(int64) -> per-expert counts -> cumsum ->
variable-size slices) cannot live in a captured graph: the sort runs on AICPU (ACL
107027, ACL_ERROR_RT_STREAM_CAPTURED), rebuilding the cumsum in the region makes the
replay fail with 507011 (ACL_ERROR_RT_MODEL_EXECUTE), and per-expert slices have
data-dependent shapes (torch.compile graph breaks). For *throughput* measurement and
for capture bring-up we replace it by a fixed assignment of (token, slot) pairs to
experts, chosen before capture, and precompute every table (counts, exclusive cumsum,
the gather/scatter permutation) on the host. Inside the region only fixed-shape
index_select / index_add_ remain; the router still computes the gate weights for the
fixed experts from its logits, so the arithmetic per token is the real one.

The outputs equal true routing only where the fixed assignment equals the router's
choice (e.g. ``from_router_logits`` on the same batch); otherwise this is a
performance stand-in, by design. Model packages hook it into their MoE block's
forward (``StaticMoERouting.forward(hidden, router_logits, experts)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .errors import PyptoCaptureError

__all__ = ["StaticMoERouting", "round_robin_assignment"]


def round_robin_assignment(num_tokens: int, top_k: int, num_experts: int) -> torch.Tensor:
    """[T, k] expert ids, (t*k + j) mod E: balanced and distinct per token when k <= E."""
    if top_k > num_experts:
        raise PyptoCaptureError(f"top_k={top_k} exceeds num_experts={num_experts}")
    t = torch.arange(num_tokens).unsqueeze(-1)
    j = torch.arange(top_k).unsqueeze(0)
    return (t * top_k + j) % num_experts


@dataclass
class StaticMoERouting:
    """Routing tables for a fixed [T, k] assignment; see the module docstring.

    Attributes (all built at construction, before any capture):
      expert_ids [T, k]; counts [E] (pairs per expert); offsets [E + 1] (exclusive cumsum);
      order [T*k] (flat pair index sorted by expert); token_of [T*k] (token of each sorted pair);
      host_offsets: the offsets as Python ints, so per-expert slices have static bounds.
    """

    expert_ids: torch.Tensor
    num_experts: int
    normalize: bool = True

    def __post_init__(self) -> None:
        ids = self.expert_ids.long()
        if ids.dim() != 2:
            raise PyptoCaptureError(
                f"expert_ids must be [tokens, top_k], got shape {tuple(ids.shape)}"
            )
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_experts):
            raise PyptoCaptureError(f"expert ids must lie in [0, {self.num_experts})")
        self.expert_ids = ids
        self.num_tokens, self.top_k = ids.shape
        flat = ids.reshape(-1)
        self.counts = torch.bincount(flat, minlength=self.num_experts)
        self.offsets = torch.zeros(self.num_experts + 1, dtype=torch.long, device=ids.device)
        self.offsets[1:] = torch.cumsum(self.counts, 0)
        self.order = torch.argsort(flat, stable=True)
        self.token_of = torch.div(self.order, self.top_k, rounding_mode="floor")
        self.host_offsets = [int(v) for v in self.offsets.cpu()]

    @classmethod
    def round_robin(
        cls,
        num_tokens: int,
        top_k: int,
        num_experts: int,
        device: torch.device | str = "cpu",
        **kw: bool,
    ) -> StaticMoERouting:
        return cls(
            round_robin_assignment(num_tokens, top_k, num_experts).to(device), num_experts, **kw
        )

    @classmethod
    def from_router_logits(
        cls, router_logits: torch.Tensor, top_k: int, **kw: bool
    ) -> StaticMoERouting:
        """Freeze the router's own top-k choice on a calibration batch (eager, before capture)."""
        ids = torch.topk(router_logits.detach(), top_k, dim=-1).indices
        return cls(ids, router_logits.shape[-1], **kw)

    def to(self, device: torch.device | str) -> StaticMoERouting:
        return StaticMoERouting(self.expert_ids.to(device), self.num_experts, self.normalize)

    # -- capture-safe pieces (fixed shapes, no host reads) ---------------------------
    def weights(self, router_logits: torch.Tensor) -> torch.Tensor:
        """[T, k] gate weights of the fixed experts: softmax over all experts, gathered."""
        probs = torch.softmax(router_logits.float(), dim=-1)
        w = torch.gather(probs, 1, self.expert_ids)
        if self.normalize:
            w = w / w.sum(-1, keepdim=True)
        return w.to(router_logits.dtype)

    def dispatch(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T*k, H] token rows grouped by expert (expert e owns rows offsets[e]:offsets[e+1])."""
        return hidden.index_select(0, self.token_of)

    def combine(self, expert_out: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Weighted sum of each token's k expert outputs back into [T, H]."""
        w = weights.reshape(-1).index_select(0, self.order).unsqueeze(-1).to(expert_out.dtype)
        out = expert_out.new_zeros(self.num_tokens, expert_out.shape[-1])
        return out.index_add_(0, self.token_of, expert_out * w)

    def forward(
        self,
        hidden: torch.Tensor,
        router_logits: torch.Tensor,
        experts: Sequence[Callable[[torch.Tensor], torch.Tensor]],
    ) -> torch.Tensor:
        """The whole MoE mixing step with static routing: dispatch, run experts, combine."""
        if hidden.shape[0] != self.num_tokens:
            raise PyptoCaptureError(
                f"routing tables were built for {self.num_tokens} tokens, got {hidden.shape[0]}"
            )
        grouped = self.dispatch(hidden)
        outs = []
        for e, expert in enumerate(experts):
            lo, hi = self.host_offsets[e], self.host_offsets[e + 1]
            if hi > lo:  # host ints fixed before capture: static slice bounds
                outs.append(expert(grouped[lo:hi]))
        return self.combine(torch.cat(outs, 0), self.weights(router_logits))

    __call__ = forward
