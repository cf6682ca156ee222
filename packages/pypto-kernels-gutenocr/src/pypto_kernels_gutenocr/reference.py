"""Torch references for the three fused ops: the golden and the fallback.

All three compute in fp32 and return the input dtype, which is also what the
PyPTO kernels do, so the fallback and the kernel agree to rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["mrope_reference", "mrope_select", "rms_norm_reference", "swiglu_mlp_reference"]


def rms_norm_reference(
    hidden_states: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight, fp32 math, input dtype out."""
    x = hidden_states.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(hidden_states.dtype)


def mrope_select(freq: torch.Tensor, mrope_section: Sequence[int]) -> torch.Tensor:
    """Pick, per head-dim chunk, the temporal/height/width row of a [3, B, S, D] cos/sin.

    The sections cover half the head dim; the second half repeats them, so the
    split list is the sections twice. Returns [B, S, D].
    """
    sections = list(mrope_section) * 2
    return torch.cat([m[i % 3] for i, m in enumerate(freq.split(sections, dim=-1))], dim=-1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def mrope_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mrope_section: Sequence[int],
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multimodal rotary embedding of q [B, Hq, S, D] and k [B, Hk, S, D].

    cos/sin are [3, B, S, D] (one row per position axis: temporal, height, width).
    """
    c = mrope_select(cos.float(), mrope_section).unsqueeze(unsqueeze_dim)
    s = mrope_select(sin.float(), mrope_section).unsqueeze(unsqueeze_dim)
    qf, kf = q.float(), k.float()
    q_out = qf * c + _rotate_half(qf) * s
    k_out = kf * c + _rotate_half(kf) * s
    return q_out.to(q.dtype), k_out.to(k.dtype)


def swiglu_mlp_reference(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
) -> torch.Tensor:
    """down(silu(x @ Wg) * (x @ Wu)) with [K, N]-packed weights, fp32 math."""
    xf = x.float()
    act = F.silu(xf @ w_gate.float()) * (xf @ w_up.float())
    # The kernel feeds the down matmul in the io dtype; round the same way.
    act = act.to(x.dtype).float()
    return (act @ w_down.float()).to(x.dtype)
