"""Torch references: the contract every kernel here is checked against.

Decode attention works on a *static* KV cache ``[B, KV, S, D]`` (pypto-capture's ring
buffers): which slots a query may see is not a shape but a device-side tensor, so a
replayed graph never sees a new shape. The kernels take that visibility as an additive
bias row per batch entry ``[B, S]`` (0 visible, a large negative number hidden), the
same thing transformers' 4D decode mask ``[B, 1, 1, S]`` holds; :func:`valid_bias`
builds it on the device from a valid length and an optional sliding window.
"""

from __future__ import annotations

import torch

__all__ = ["gqa_decode_reference", "ring_valid", "softmax_reference", "valid_bias"]


def ring_valid(length: torch.Tensor, slots: int, window: int | None = None) -> torch.Tensor:
    """``[B, S]`` bool: which ring slots hold a visible position, computed on the device.

    ``length`` ([B] or [1], integer) counts the tokens written so far, the current one
    included. A full layer's cache (``window`` None) holds position ``p`` at slot ``p``:
    slots ``< length`` are valid. A sliding layer's ring of ``slots = min(window, cap)``
    holds position ``p`` at slot ``p % slots`` (pypto-capture's layout): slot ``k`` holds
    ``a_k = c - ((c - k) mod slots)`` for the current position ``c = length - 1``; it is
    visible when ``a_k >= 0`` and ``c - a_k < window``.
    """
    length = length.reshape(-1, 1).long()
    k = torch.arange(slots, device=length.device).unsqueeze(0)
    if window is None:
        return k < length
    c = length - 1
    absolute = c - torch.remainder(c - k, slots)
    return (absolute >= 0) & (c - absolute < window)


def valid_bias(
    length: torch.Tensor, slots: int, window: int | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The additive ``[B, S]`` bias of :func:`ring_valid` (0 or ``finfo(dtype).min``)."""
    valid = ring_valid(length, slots, window)
    zero = torch.zeros((), dtype=dtype, device=valid.device)
    neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=valid.device)
    return torch.where(valid, zero, neg)


def gqa_decode_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    scaling: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """One query token per row against the cache: ``q [B, H, 1, D]``, ``k/v [B, KV, S, D]``,
    ``bias [B, S]`` -> ``[B, H, 1, D]``.

    The arithmetic is transformers' ``eager_attention_forward`` (Gemma 4's): scores in
    the input dtype times ``scaling``, optional tanh softcap, plus the bias, softmax in
    fp32 cast back to the input dtype, then the value matmul. Heads ``g*G .. g*G+G-1``
    read KV head ``g`` (``G = H // KV``), as ``repeat_kv`` arranges.
    """
    b, h, sq, d = q.shape
    kv, slots = k.shape[1], k.shape[2]
    if kv == 0 or h % kv:
        raise ValueError(
            f"{h} query heads are not a multiple of {kv} KV heads; pass matching q and k"
        )
    if bias.dim() != 2 or bias.shape[-1] != slots or bias.shape[0] not in (1, b):
        raise ValueError(
            f"bias {tuple(bias.shape)} must be [B, S] = [{b}, {slots}]; build it with valid_bias"
        )
    qg = q.reshape(b, kv, (h // kv) * sq, d)
    scores = torch.matmul(qg, k.transpose(-1, -2)) * scaling  # [B, KV, G*Sq, S]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores + bias.to(scores.dtype)[:, None, None, :]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs, v)  # [B, KV, G*Sq, D]
    return out.reshape(b, h, sq, d)


def softmax_reference(x: torch.Tensor) -> torch.Tensor:
    """Row softmax over the last dim, fp32 inside, the input dtype out (eager attention's)."""
    return torch.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)
