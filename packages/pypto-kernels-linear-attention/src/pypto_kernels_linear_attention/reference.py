"""Torch references of one decode step of a Gated DeltaNet layer and of a KDA layer.

Why written out rather than calling transformers: the reference is also the counted
fallback inside a captured step and the golden of the precision cases, so it must take
the kernel's exact inputs (the layer's raw projections, one token, the cache's fp32
state updated in place) and compute transformers' operations in transformers' order and
dtypes, so that a model whose layers run it decodes the tokens eager decodes.

Sources, transformers 5.24 (the same code since the layers landed in 5.x):

* Gated DeltaNet (``Qwen3NextGatedDeltaNet`` / ``Qwen3_5GatedDeltaNet``):
  ``beta = b.sigmoid()``, ``g = -A_log.float().exp() * softplus(a.float() + dt_bias)``,
  ``torch_recurrent_gated_delta_rule`` for one token (key heads repeated over their
  value heads, ``l2norm`` = ``x * rsqrt(sum(x * x) + 1e-6)`` in fp32, ``q / sqrt(Dk)``,
  state decayed by ``exp(g)``, delta rule, read-out), the output cast back to the input
  dtype, then ``RMSNormGated`` (normalise in fp32, cast, times the weight, times
  ``silu(z)`` in fp32, cast).
* KDA (``KimiLinearDeltaAttention``): ``KimiLinearForgetGate``'s
  ``-exp(A_log) * softplus(f + dt_bias)`` (``log(1 + exp(x))`` below 20) gives a decay per
  key channel, ``beta = sigmoid(b)``, ``recurrent_kimi_delta_attention`` for one token
  (``l2norm`` = ``x / sqrt(sum(x * x) + 1e-6)``, ``q * (1 / sqrt(D))``), then
  ``KimiLinearRMSNormGated`` (fp32 throughout, weight in fp32, ``sigmoid`` gate).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["gated_delta_step_reference", "kda_step_reference"]

#: transformers' l2norm epsilon for q and k (both layer types).
QK_EPS = 1e-6


def _delta_rule(
    qf: torch.Tensor,
    kf: torch.Tensor,
    vf: torch.Tensor,
    beta: torch.Tensor,
    decay: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """One delta-rule step on fp32 ``[B, H, D*]`` operands; ``decay`` broadcasts to the
    state ``[B, H, Dk, Dv]``. Writes the new state into ``state``, returns the read-out."""
    s = state * decay
    kv_mem = (s * kf.unsqueeze(-1)).sum(dim=-2)
    delta = (vf - kv_mem) * beta.unsqueeze(-1)
    s = s + kf.unsqueeze(-1) * delta.unsqueeze(-2)
    out = (s * qf.unsqueeze(-1)).sum(dim=-2)
    state.copy_(s)
    return out


def gated_delta_step_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    z: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """One Gated DeltaNet decode step; returns the gated-normed output ``[B, Hv, Dv]``.

    ``q``, ``k`` [B, Hk, Dk] (after the causal conv, before l2norm); ``v``, ``z``
    [B, Hv, Dv]; ``a``, ``b`` [B, Hv] (``in_proj_a`` / ``in_proj_b`` outputs); ``A_log``,
    ``dt_bias`` [Hv]; ``norm_weight`` [Dv]; ``state`` [B, Hv, Dk, Dv] fp32, updated in place.
    """
    io = q.dtype
    if k.shape[1] < 1 or v.shape[1] % k.shape[1]:
        raise ValueError(f"{v.shape[1]} value heads cannot share {k.shape[1]} key heads evenly")
    rep = v.shape[1] // k.shape[1]
    beta = b.sigmoid()
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    if rep != 1:
        q = q.repeat_interleave(rep, dim=1)
        k = k.repeat_interleave(rep, dim=1)
    qf, kf = q.float(), k.float()
    qf = qf * torch.rsqrt((qf * qf).sum(dim=-1, keepdim=True) + QK_EPS)
    kf = kf * torch.rsqrt((kf * kf).sum(dim=-1, keepdim=True) + QK_EPS)
    qf = qf / (qf.shape[-1] ** 0.5)
    decay = g.exp()[..., None, None]
    out = _delta_rule(qf, kf, v.float(), beta.float(), decay, state).to(io)
    h = out.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    h = norm_weight * h.to(io)
    h = h * F.silu(z.to(torch.float32))
    return h.to(io)


def kda_step_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g_raw: torch.Tensor,
    b: torch.Tensor,
    gate: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """One KDA decode step; returns the gated-normed output ``[B, H, D]``.

    ``q``, ``k``, ``v`` [B, H, D] (after the causal conv); ``g_raw`` [B, H, D] (the forget
    gate's ``f_b_proj`` output, before its bias); ``b`` [B, H] (``b_proj`` output); ``gate``
    [B, H, D] (``g_b_proj`` output); ``A_log`` [H] (any shape holding H values);
    ``dt_bias`` [H * D]; ``norm_weight`` [D]; ``state`` [B, H, D, D] fp32, in place.
    """
    io = q.dtype
    _, heads, dim = k.shape
    g = g_raw.float() + dt_bias.float().view(1, heads, dim)
    g_softplus = torch.where(g > 20.0, g, torch.log(1.0 + torch.exp(g)))
    g = -torch.exp(A_log.float().reshape(1, heads, 1)) * g_softplus
    beta = torch.sigmoid(b)
    qf, kf = q.float(), k.float()
    qf = qf / torch.sqrt((qf * qf).sum(dim=-1, keepdim=True) + QK_EPS)
    kf = kf / torch.sqrt((kf * kf).sum(dim=-1, keepdim=True) + QK_EPS)
    qf = qf * (1 / (dim**0.5))
    decay = g.exp().unsqueeze(-1)
    out = _delta_rule(qf, kf, v.float(), beta.float(), decay, state).to(io)
    h = out.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    h = norm_weight.to(torch.float32) * h
    h = h * torch.sigmoid(gate.to(torch.float32))
    return h.to(io)
