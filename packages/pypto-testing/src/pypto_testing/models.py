"""Tiny, real HuggingFace model folders for tests.

Tests across the monorepo need folders that ``from_pretrained(local_files_only=True)``
loads exactly like a downloaded checkpoint: a config.json, real safetensors weights
and a working tokenizer. Sizes are tiny so a CPU forward takes milliseconds, but the
code paths (GQA, rotary, sliding windows, tied embeddings) are the real ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "SPECIAL_TOKENS",
    "TINY_CONFIGS",
    "byte_vocab",
    "make_tiny_model",
    "read_config",
    "tiny_config",
    "write_byte_tokenizer",
]

# Architectures every family-agnostic test can rely on. The values are the smallest
# that still exercise grouped-query attention (4 query heads over 2 KV heads).
_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "head_dim": 16},
    "qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]},
    "qwen3": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": 16},
    "mistral": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "head_dim": 16},
    # Gemma3 mixes sliding-window and global layers: layers differ in cache length.
    "gemma3": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "head_dim": 16,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 16,
    },
}

# Byte-level vocabulary: every byte is a token, plus three specials. With no merges
# any text round-trips, which keeps smoke-gate tests honest about decoding.
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]


def byte_vocab() -> dict[str, int]:
    """Every byte a token, plus the three specials (shared by the tiny tokenizers)."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    return vocab


def write_byte_tokenizer(path: str | Path) -> int:
    """Write a byte-level tokenizer (tokenizer.json + config) into ``path``.

    Returns the vocabulary size so a config can be sized to match.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = byte_vocab()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(str(path))
    return len(vocab)


def tiny_config(arch: str = "llama", **overrides: Any):
    """A transformers config object for the tiny ``arch`` (see ``TINY_CONFIGS``)."""
    from transformers import AutoConfig

    if arch not in TINY_CONFIGS:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose from {sorted(TINY_CONFIGS)}")
    values = {**_COMMON, **TINY_CONFIGS[arch], "vocab_size": len(SPECIAL_TOKENS) + 256}
    values.update({"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2})
    values.update(overrides)
    model_type = values.pop("model_type")
    return AutoConfig.for_model(model_type, **values)


def make_tiny_model(
    path: str | Path,
    arch: str = "llama",
    *,
    seed: int = 0,
    dtype: str = "float32",
    **config_overrides: Any,
) -> Path:
    """Create a loadable model folder at ``path`` with seeded random weights.

    The folder holds config.json, model.safetensors, generation_config.json and a
    byte-level tokenizer, i.e. what a hub download of a causal LM contains.
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(path)
    config = tiny_config(arch, **config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config.pad_token_id = 0
    model.save_pretrained(str(path), safe_serialization=True)
    return path.resolve()


def read_config(path: str | Path) -> dict[str, Any]:
    """config.json of a model folder as a dict (tests compare it before and after)."""
    return json.loads((Path(path) / "config.json").read_text())
