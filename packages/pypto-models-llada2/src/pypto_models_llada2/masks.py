"""LLaDA2's attention masks: block-causal (bidirectional inside a block, causal across blocks).

Shared by the network (:mod:`pypto_models_llada2.modeling`, which builds the mask for a
plain forward) and block-diffusion generation (:mod:`pypto_models_llada2.generation`,
which builds it per block against the KV cache); both import it from here.
"""

from __future__ import annotations

import torch

__all__ = ["DEFAULT_BLOCK_LENGTH", "additive_mask", "block_causal_allowed", "prepare_mask"]

#: Block length the published generation uses; a plain forward without a mask uses it too.
DEFAULT_BLOCK_LENGTH = 32


def block_causal_allowed(
    query_positions: torch.Tensor, key_positions: torch.Tensor, block_length: int
) -> torch.Tensor:
    """Bool [Sq, Sk]: a query sees every key of its own and of earlier blocks.

    Bidirectional inside a block, causal across blocks: LLaDA2's training and generation
    mask (the published ``log(tril(ones(nb, nb)))`` expanded to tokens).
    """
    qb = torch.div(query_positions, block_length, rounding_mode="floor")
    kb = torch.div(key_positions, block_length, rounding_mode="floor")
    return kb.unsqueeze(0) <= qb.unsqueeze(-1)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool allow-mask -> additive float mask (0 where allowed, the dtype's minimum elsewhere)."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, neg)


def prepare_mask(
    attention_mask: torch.Tensor | None,
    *,
    batch: int,
    q_len: int,
    k_len: int,
    position_ids: torch.Tensor,
    block_length: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The additive [B, 1, Sq, Sk] mask the attention layers use.

    * 4-D bool: True = attend (an allow-mask);
    * 4-D float: additive, as the published generation passes it (``log`` of a 0/1 mask);
    * 2-D [B, Sk] 0/1 padding mask, or None: the block-causal mask over ``position_ids``
      (combined with the padding mask). This is what makes a plain ``model(ids)`` work.
    """
    if attention_mask is not None and attention_mask.dim() == 4:
        if tuple(attention_mask.shape[-2:]) != (q_len, k_len) or attention_mask.shape[1] != 1:
            raise ValueError(
                f"a 4-D attention_mask must be [batch, 1, {q_len}, {k_len}] for this input; "
                f"got {tuple(attention_mask.shape)}"
            )
        if attention_mask.dtype == torch.bool:
            return additive_mask(attention_mask, dtype)
        return attention_mask.to(dtype)
    if q_len != k_len:
        raise ValueError(
            "a cached forward needs an explicit 4-D attention_mask [batch, 1, q_len, kv_len]"
        )
    pos = position_ids[0] if position_ids.dim() == 2 else position_ids
    allowed = block_causal_allowed(pos, pos, block_length)[None, None]
    if attention_mask is not None:
        if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, k_len):
            raise ValueError(
                f"attention_mask must be 2-D [batch, seq] or 4-D; got {tuple(attention_mask.shape)}"
            )
        allowed = allowed & attention_mask.bool()[:, None, None, :]
    return additive_mask(allowed.expand(batch, 1, q_len, k_len), dtype)
