"""The torch reference of the grouped-GEMM experts, with the kernel's exact contract.

Why a gather (``index_select`` + ``bmm``) and not transformers' loop: the reference is
also the counted fallback inside a captured step, so it must have fixed shapes and no
host reads, like the kernel. Contributions are added per token in ascending expert id,
in the hidden dtype, after ``(y * weight).to(dtype)``: the order and rounding of
transformers' ``index_add_`` loop, so greedy tokens match eager generation.
"""

from __future__ import annotations

import torch

__all__ = ["ACTIVATION_NAMES", "activate", "ascending_slots", "grouped_gemm_reference"]

#: What the kernel computes; the same names as :data:`.kernels.ACTIVATIONS`.
ACTIVATION_NAMES = ("silu", "gelu_tanh", "swigluoai")


def activate(h: torch.Tensor, act: str, alpha: float, limit: float) -> torch.Tensor:
    """``[.., 2I] -> [.., I]``: SwiGLU (``silu``), GeGLU (``gelu_tanh``) or MiniMax M3's
    clamped ``swigluoai``."""
    g, u = h.chunk(2, dim=-1)
    if act == "silu":
        return torch.nn.functional.silu(g) * u
    if act == "gelu_tanh":
        return torch.nn.functional.gelu(g, approximate="tanh") * u
    if act == "swigluoai":
        g = g.clamp(max=limit)
        u = u.clamp(min=-limit, max=limit)
        return (u + 1.0) * (g * torch.sigmoid(g * alpha))
    raise ValueError(f"unknown activation {act!r}; choose one of {', '.join(ACTIVATION_NAMES)}")


def ascending_slots(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's (ids, weights) reordered by ascending expert id, on the device.

    A slot's rank is how many of its token's experts have a smaller id (ids are distinct
    per token); scattering by rank sorts without ``argsort`` (which an NPU puts on AICPU
    for int64) and without any data-dependent shape.
    """
    if top_k_index.shape[-1] == 1:
        return top_k_index, top_k_weights
    rank = (top_k_index.unsqueeze(-1) > top_k_index.unsqueeze(-2)).sum(-1)
    ids = torch.empty_like(top_k_index).scatter_(-1, rank, top_k_index)
    weights = torch.empty_like(top_k_weights).scatter_(-1, rank, top_k_weights)
    return ids, weights


def grouped_gemm_reference(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: str = "silu",
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:
    """``out[t] = sum_j (w[t,j] * down[e] @ act(gate_up[e] @ x[t])).to(dtype)``, e = ids[t,j].

    ``hidden_states`` [T, H]; ``top_k_index``/``top_k_weights`` [T, k]; ``gate_up``
    [E, 2I, H] and ``down`` [E, H, I] (transformers' fused experts layout).
    """
    t, h = hidden_states.shape
    k = top_k_index.shape[-1]
    ids, weights = ascending_slots(top_k_index, top_k_weights)
    flat = ids.reshape(-1)
    x = hidden_states.unsqueeze(1).expand(t, k, h).reshape(t * k, h)
    up = torch.bmm(gate_up.index_select(0, flat), x.unsqueeze(-1)).squeeze(-1)
    a = activate(up, act, alpha, limit)
    y = torch.bmm(down.index_select(0, flat), a.unsqueeze(-1)).squeeze(-1)
    contrib = (y * weights.reshape(-1, 1)).to(hidden_states.dtype).view(t, k, h)
    acc = contrib[:, 0]
    for j in range(1, k):
        acc = acc + contrib[:, j]
    return acc
