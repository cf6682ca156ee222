"""Microbenchmarks run in the profiling session, at the profiled model's own shapes.

A KV-cache layout is recommended only where it measured faster here: the trace can
show that a cache is transposed every step, not that the other layout would be quicker
on this device (a transposed read can be cheap where the kernel takes strides).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

__all__ = [
    "attention_shapes",
    "kv_layout_times",
]


def attention_shapes(model: Any, batch: int, context: int) -> dict[str, int]:
    cfg = model.config
    getter = getattr(cfg, "get_text_config", None)
    cfg = getter() if callable(getter) else cfg
    heads = int(getattr(cfg, "num_attention_heads", 1))
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    dim = int(getattr(cfg, "head_dim", None) or int(cfg.hidden_size) // heads)
    return {"batch": batch, "heads": heads, "kv_heads": kv, "head_dim": dim, "context": context}


def kv_layout_times(
    *,
    batch: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    context: int,
    device: Any = "cpu",
    dtype: Any = None,
    repeats: int = 30,
) -> dict[str, Any]:
    """One decode attention with the cache in two layouts, timed side by side.

    ``seq_major`` keeps K/V as [B, S, H, D] and makes the attention's [B, H, S, D] view
    contiguous every step (what a cache stored in token order pays); ``head_major``
    stores [B, H, S, D] and attends directly. Median of ``repeats`` (alternating the
    two, so load changes hit both).
    """
    import torch
    import torch.nn.functional as F

    from pypto_capture import synchronize

    dtype = dtype or torch.float32
    dev = torch.device(device)
    q = torch.randn(batch, heads, 1, head_dim, device=dev, dtype=dtype)
    k_seq = torch.randn(batch, context, kv_heads, head_dim, device=dev, dtype=dtype)
    v_seq = torch.randn_like(k_seq)
    k_head = k_seq.transpose(1, 2).contiguous()
    v_head = v_seq.transpose(1, 2).contiguous()
    groups = heads // kv_heads

    def attend(k: Any, v: Any) -> Any:
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q, k, v)

    def seq_major() -> Any:
        return attend(k_seq.transpose(1, 2).contiguous(), v_seq.transpose(1, 2).contiguous())

    def head_major() -> Any:
        return attend(k_head, v_head)

    def once(fn: Any) -> float:
        synchronize(dev)
        t = time.perf_counter()
        fn()
        synchronize(dev)
        return time.perf_counter() - t

    with torch.inference_mode():
        for fn in (seq_major, head_major):
            fn()
        a, b = [], []
        for _ in range(repeats):
            a.append(once(seq_major))
            b.append(once(head_major))
    ta, tb = statistics.median(a), statistics.median(b)
    return {
        "shapes": {
            "batch": batch,
            "heads": heads,
            "kv_heads": kv_heads,
            "head_dim": head_dim,
            "context": context,
            "dtype": str(dtype).replace("torch.", ""),
        },
        "seq_major_us": ta * 1e6,
        "head_major_us": tb * 1e6,
        "head_major_speedup": ta / tb if tb > 0 else None,
        "method": f"median of {repeats} alternating runs of one decode attention per layout",
    }
