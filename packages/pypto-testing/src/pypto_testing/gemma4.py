"""Tiny Gemma 4 folders: the published checkpoints' structure and format, small sizes.

What a hub download of ``google/gemma-4-31B-it`` (or 26B-A4B, E4B, E2B) holds, scaled
down: a nested ``Gemma4ForConditionalGeneration`` config.json written as the checkpoints
write it (``model_type: gemma4``; ``text_config`` with ``head_dim`` / ``global_head_dim``,
``num_key_value_heads`` / ``num_global_key_value_heads``, ``attention_k_eq_v``, the two RoPE
variants per layer type, ``final_logit_softcapping``, ``layer_types``; not the
``per_layer_config`` transformers 5.24 would serialise), safetensors weights saved from
transformers' *native* ``Gemma4ForConditionalGeneration`` (so the weight names are the
checkpoint's), a generation config and a byte-level tokenizer.

Random weights are drawn wider than transformers' init (embeddings std 0.02, matrices
0.25): with the default init a tied-embedding Gemma repeats its input token, and a greedy
parity test over 40 tokens would compare one token 40 times.

It lives here, not in pypto-models-gemma4, so the model package's library code never
imports test helpers; it uses transformers' native classes only. Needs the ``models`` extra.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from .models import write_byte_tokenizer

__all__ = [
    "DEFAULT_PATTERN",
    "GEMMA4_31B_CONFIG",
    "PATTERNS",
    "TINY_TEXT",
    "TINY_VISION",
    "VARIANT_TEXT",
    "expected_kv_cache_bytes",
    "make_tiny_gemma4",
    "tiny_gemma4_config",
]

S, F = "sliding_attention", "full_attention"

#: google/gemma-4-31B-it's config.json as published (no vision_config here: the tests that
#: use it build configs, never weights). For checks against the real sizes.
GEMMA4_31B_CONFIG: dict[str, Any] = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "text_config": {
        "model_type": "gemma4_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attention_k_eq_v": True,
        "enable_moe_block": False,
        "final_logit_softcapping": 30.0,
        "global_head_dim": 512,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 5376,
        "hidden_size_per_layer_input": 0,
        "intermediate_size": 21504,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
        "max_position_embeddings": 262144,
        "num_attention_heads": 32,
        "num_global_key_value_heads": 4,
        "num_hidden_layers": 60,
        "num_key_value_heads": 16,
        "num_kv_shared_layers": 0,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
                "rope_type": "proportional",
            },
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": 1024,
        "tie_word_embeddings": True,
        "use_double_wide_mlp": False,
        "vocab_size": 262144,
        "vocab_size_per_layer_input": 262144,
    },
    "tie_word_embeddings": True,
}

#: Layer-type patterns (the real checkpoints are 5:1 with a full last layer; E2B is 4:1).
PATTERNS: dict[str, list[str]] = {
    "5to1": [S, S, S, S, S, F],
    "2to1x2": [S, S, F, S, S, F],
    "2to1x3": [S, S, F, S, S, F, S, S, F],
    "1to1": [S, F, S, F],
}

#: Each variant's default pattern. KV sharing needs a producer of every layer type before
#: the shared tail (the E2B checkpoint: 15 producing layers, 20 sharing ones).
DEFAULT_PATTERN = {"31b": "5to1", "26b_a4b": "5to1", "e2b": "2to1x3"}

#: The 31B text decoder scaled down: 4 q heads; sliding layers 2 KV heads x 16, full layers
#: 1 KV head x 32 with K = V; window 8; softcap 30; both RoPE variants.
TINY_TEXT: dict[str, Any] = {
    "model_type": "gemma4_text",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_global_key_value_heads": 1,
    "global_head_dim": 32,
    "attention_k_eq_v": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "sliding_window": 8,
    "final_logit_softcapping": 30.0,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "enable_moe_block": False,
    "use_double_wide_mlp": False,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "full_attention": {
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
            "rope_type": "proportional",
        },
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    "tie_word_embeddings": True,
    "use_cache": True,
}

#: What each published variant adds to the text decoder.
VARIANT_TEXT: dict[str, dict[str, Any]] = {
    "31b": {},
    # 26B-A4B: a routed MoE block beside the dense MLP; fewer KV heads on full layers.
    "26b_a4b": {
        "enable_moe_block": True,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 32,
    },
    # E2B/E4B: per-layer input embeddings and KV-sharing trailing layers (no K = V).
    "e2b": {
        "attention_k_eq_v": False,
        "num_global_key_value_heads": None,
        "hidden_size_per_layer_input": 8,
        "num_kv_shared_layers": 3,
        "use_double_wide_mlp": True,
    },
}

#: A two-block vision tower (the 31B checkpoint ships one; text decode does not use it).
TINY_VISION: dict[str, Any] = {
    "model_type": "gemma4_vision",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "position_embedding_size": 64,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
}


def tiny_gemma4_config(
    variant: str = "31b",
    *,
    pattern: str | list[str] | None = None,
    sliding_window: int = 8,
    vocab_size: int = 259,
    vision: bool | None = None,
    **text_overrides: Any,
) -> dict[str, Any]:
    """The config.json dict of a tiny Gemma 4 folder (published field names only)."""
    if variant not in VARIANT_TEXT:
        raise ValueError(f"unknown Gemma 4 variant {variant!r}; choose from {sorted(VARIANT_TEXT)}")
    pattern = DEFAULT_PATTERN[variant] if pattern is None else pattern
    layer_types = list(PATTERNS[pattern] if isinstance(pattern, str) else pattern)
    text = copy.deepcopy(TINY_TEXT)
    text.update(copy.deepcopy(VARIANT_TEXT[variant]))
    text.update(
        num_hidden_layers=len(layer_types),
        layer_types=layer_types,
        sliding_window=sliding_window,
        vocab_size=vocab_size,
        vocab_size_per_layer_input=vocab_size,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    text.update(text_overrides)
    text = {k: v for k, v in text.items() if v is not None}
    with_vision = (variant == "31b") if vision is None else vision
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        "vision_config": copy.deepcopy(TINY_VISION) if with_vision else None,
        "audio_config": None,
        "boi_token_id": 255999,
        "eoi_token_id": 258882,
        "image_token_id": 258880,
        "video_token_id": 258884,
        "boa_token_id": 256000,
        "eoa_token_index": 258883,
        "audio_token_id": 258881,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "dtype": "float32",
    }


def make_tiny_gemma4(
    path: str | Path,
    variant: str = "31b",
    *,
    seed: int = 0,
    pattern: str | list[str] | None = None,
    sliding_window: int = 8,
    vision: bool | None = None,
    **text_overrides: Any,
) -> Path:
    """Write a tiny Gemma 4 folder at ``path`` (created if missing) and return it resolved.

    ``variant``: "31b" (dense, K = V full layers, a vision tower), "26b_a4b" (MoE block)
    or "e2b" (per-layer embeddings, KV-sharing layers). ``pattern``: a key of ``PATTERNS``
    or a list of layer types (the last must be full attention, as in every checkpoint);
    None picks the variant's ``DEFAULT_PATTERN``.
    """
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, GenerationConfig

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_byte_tokenizer(path)
    cfg = tiny_gemma4_config(
        variant,
        pattern=pattern,
        sliding_window=sliding_window,
        vocab_size=vocab,
        vision=vision,
        **text_overrides,
    )
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(Gemma4Config(**copy.deepcopy(cfg))).eval()
    with torch.no_grad():
        for name, param in model.model.language_model.named_parameters():
            if "embed" in name:
                param.normal_(0.0, 0.02)
            elif param.dim() >= 2:
                param.normal_(0.0, 0.25)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(str(path), safe_serialization=True)
    # The checkpoint's own config.json, not the installed transformers' serialisation.
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return path.resolve()


def expected_kv_cache_bytes(
    config: dict[str, Any], *, batch: int, max_cache_len: int, bytes_per_element: int = 4
) -> int:
    """The capture-safe cache's size from config.json alone (the formula a test checks).

    Each layer holding a cache keeps K and V of ``[batch, kv_heads, slots, head_dim]``:
    sliding layers ``min(window, max_cache_len)`` slots with ``num_key_value_heads`` x
    ``head_dim``; full layers ``max_cache_len`` slots with ``num_global_key_value_heads``
    (when K = V; else ``num_key_value_heads``) x ``global_head_dim``. The last
    ``num_kv_shared_layers`` layers hold nothing (they read a producer's cache).
    """
    text = config["text_config"]
    n = text["num_hidden_layers"]
    shared_from = n - int(text.get("num_kv_shared_layers") or 0)
    total = 0
    for i, t in enumerate(text["layer_types"]):
        if i >= shared_from:
            continue
        if t == "sliding_attention":
            slots = min(int(text["sliding_window"]), max_cache_len)
            heads, dim = text["num_key_value_heads"], text["head_dim"]
        else:
            slots = max_cache_len
            k_eq_v = bool(text.get("attention_k_eq_v"))
            heads = (text.get("num_global_key_value_heads") if k_eq_v else None) or text[
                "num_key_value_heads"
            ]
            dim = text.get("global_head_dim") or text["head_dim"]
        total += 2 * batch * heads * slots * dim * bytes_per_element
    return total
