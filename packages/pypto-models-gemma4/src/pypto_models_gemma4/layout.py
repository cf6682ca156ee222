"""What the capture-safe decode cache of a Gemma 4 model holds, computed from its config.

Gemma 4's memory story is its layer mix: on the 31B checkpoint 50 sliding layers
(16 KV heads x 256) need only ``sliding_window`` (1024) slots while 10 full layers (4 KV
heads x 512, K = V) need the whole context; the last ``num_kv_shared_layers`` layers of the
small variants hold nothing. transformers' ``StaticCache`` cannot serve that ring-buffer
way under capture (see pypto-capture's cache), so this is the formula a user plans memory
with, and a test checks pypto-capture's real buffers against it.

Head shapes are read the way the installed transformers stores them: ``per_layer_config``
(5.24) or the checkpoint's ``global_head_dim`` / ``num_global_key_value_heads`` (5.8).
"""

from __future__ import annotations

from typing import Any

from pypto_capture import layer_pattern

__all__ = ["decode_layout", "expected_cache_bytes"]


def _text(config: Any) -> Any:
    config = getattr(config, "config", config)  # a model
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _head_shape(text: Any, index: int, layer_type: str) -> tuple[int, int]:
    """(KV heads, head_dim) of one layer, whichever way this transformers stores them."""
    per_layer = getattr(text, "per_layer_config", None)
    if per_layer is not None:
        try:
            entry = per_layer[index]
            return int(entry.num_key_value_heads), int(entry.head_dim)
        except (KeyError, IndexError, TypeError, AttributeError):
            pass
    heads, dim = int(text.num_key_value_heads), int(text.head_dim)
    if layer_type == "full_attention":
        dim = int(getattr(text, "global_head_dim", None) or dim)
        if getattr(text, "attention_k_eq_v", False):
            heads = int(getattr(text, "num_global_key_value_heads", None) or heads)
    return heads, dim


def _consumers(text: Any, n: int) -> list[bool]:
    modes = getattr(text, "kv_sharing_modes", None)
    if isinstance(modes, (list, tuple)) and len(modes) == n:
        return [m == "reuse" for m in modes]
    shared = int(getattr(text, "num_kv_shared_layers", 0) or 0)
    return [i >= n - shared for i in range(n)]


def decode_layout(
    config: Any, *, batch_size: int, max_cache_len: int, bytes_per_element: int = 2
) -> dict[str, Any]:
    """Per-layer slots, heads, head_dim and bytes of the decode cache, plus totals.

    ``config``: a Gemma 4 config (or a model). The result has the shape of
    ``pypto_capture``'s ``CaptureSafeCache.describe()`` (``pattern``, ``layers``,
    ``total_bytes``), plus ``static_cache_bytes``: what a cache giving every layer
    ``max_cache_len`` slots would take, for comparison.
    """
    text = _text(config)
    types_ = list(text.layer_types)
    n = len(types_)
    window = int(text.sliding_window)
    shared = _consumers(text, n)
    layers: list[dict[str, Any]] = []
    total = naive = 0
    for i, t in enumerate(types_):
        heads, dim = _head_shape(text, i, t)
        entry: dict[str, Any] = {"index": i, "type": t, "shared": shared[i]}
        if not shared[i]:
            slots = min(window, max_cache_len) if t == "sliding_attention" else max_cache_len
            nbytes = 2 * batch_size * heads * slots * dim * bytes_per_element
            entry.update(slots=slots, kv_heads=heads, head_dim=dim, bytes=nbytes)
            total += nbytes
            naive += 2 * batch_size * heads * max_cache_len * dim * bytes_per_element
        layers.append(entry)
    return {
        "pattern": layer_pattern(types_),
        "max_cache_len": max_cache_len,
        "batch_size": batch_size,
        "layers": layers,
        "total_bytes": total,
        "static_cache_bytes": naive,
    }


def expected_cache_bytes(
    config: Any, *, batch_size: int, max_cache_len: int, bytes_per_element: int = 2
) -> int:
    """Total bytes of :func:`decode_layout` (K and V of every layer that holds a cache)."""
    return int(
        decode_layout(
            config,
            batch_size=batch_size,
            max_cache_len=max_cache_len,
            bytes_per_element=bytes_per_element,
        )["total_bytes"]
    )
