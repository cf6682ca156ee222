"""Tiny LLaDA2-MoE folders in the published checkpoints' format, small sizes.

What a hub download of ``inclusionAI/LLaDA2.0-mini`` holds, scaled down: a config.json
written as the checkpoints write it (``model_type: llada2_moe``, ``architectures:
["LLaDA2MoeModelLM"]``, the checkpoint's ``auto_map``, ``rope_theta`` / ``rope_scaling:
null`` / ``partial_rotary_factor``, grouped sigmoid routing with ``expert_bias``, shared
expert, first dense layers, qk-norm, the mask / EOS / pad ids), safetensors weights under
the checkpoint's own names (fused ``attention.query_key_value``, per-expert
``mlp.experts.N.{gate,up,down}_proj``, ``mlp.gate.expert_bias``, ``word_embeddings``), a
byte-level tokenizer with a ``<|mask|>`` token, and the checkpoint's remote-code files,
stood in for by modules that fail to import on transformers 5.x exactly where the
published ones do (``transformers.modeling_attn_mask_utils`` is gone).

The weights are written here, name by name, without any modeling code: a loader that
reads them proves it accepts the checkpoint format, not a format it wrote itself. Random
weights are drawn with small embeddings (std 0.02) and matrices at twice the unit fan-in
scale, so the layers, not the (identical) mask embeddings, dominate the residual stream:
at the plain fan-in scale a tiny model fills every masked position with one or two tokens,
and a parity test would compare the same token over and over.

It lives in pypto-testing so pypto-models-llada2 never ships test helpers. Needs the
``models`` extra.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .models import byte_vocab

__all__ = [
    "LLADA2_FLASH_OVERRIDES",
    "LLADA2_MINI_CONFIG",
    "MASK_TOKEN",
    "REMOTE_CODE_FILES",
    "TINY_LLADA2",
    "checkpoint_weight_shapes",
    "make_tiny_llada2",
    "tiny_llada2_config",
]

MASK_TOKEN = "<|mask|>"

#: The checkpoint's auto_map (the remote-code module and class names).
AUTO_MAP = {
    "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
    "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
    "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
}

#: inclusionAI/LLaDA2.0-mini's config.json fields (16B total; no weights are ever built
#: from it: tests use it to check config loading and sizes).
LLADA2_MINI_CONFIG: dict[str, Any] = {
    "architectures": ["LLaDA2MoeModelLM"],
    "auto_map": dict(AUTO_MAP),
    "model_type": "llada2_moe",
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 5120,
    "moe_intermediate_size": 512,
    "num_hidden_layers": 20,
    "first_k_dense_replace": 1,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "partial_rotary_factor": 0.5,
    "rope_theta": 600000,
    "rope_scaling": None,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "num_shared_experts": 1,
    "n_group": 8,
    "topk_group": 4,
    "score_function": "sigmoid",
    "moe_router_enable_expert_bias": True,
    "router_dtype": "fp32",
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "use_qk_norm": True,
    "use_qkv_bias": False,
    "use_bias": False,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "vocab_size": 157184,
    "pad_token_id": 156892,
    "eos_token_id": 156892,
    "mask_token_id": 156895,
    "use_cache": False,
    "torch_dtype": "bfloat16",
}

#: What LLaDA2.0-flash (100B) changes relative to -mini.
LLADA2_FLASH_OVERRIDES: dict[str, Any] = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "moe_intermediate_size": 1024,
}

#: The tiny model: LLaDA2.0-mini's structure (dense layer 0, MoE after, grouped routing,
#: shared expert, partial rotary, qk-norm, GQA), small sizes.
TINY_LLADA2: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 160,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "partial_rotary_factor": 0.5,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "num_shared_experts": 1,
    "n_group": 4,
    "topk_group": 2,
    "max_position_embeddings": 1024,
    "torch_dtype": "float32",
}

# Stand-ins for the checkpoint's remote code: they fail on transformers 5.x where the
# published files fail (the import of a module 5.x removed), and define nothing else.
_REMOTE_CONFIG = '''"""Stand-in for the checkpoint's configuration_llada2_moe.py (pypto-testing)."""
from transformers.modeling_attn_mask_utils import AttentionMaskConverter  # noqa: F401  (gone in 5.x)
'''
_REMOTE_MODELING = '''"""Stand-in for the checkpoint's modeling_llada2_moe.py (pypto-testing)."""
from transformers.modeling_attn_mask_utils import (  # noqa: F401  (gone in 5.x)
    _prepare_4d_causal_attention_mask_for_sdpa,
)
'''
REMOTE_CODE_FILES = {
    "configuration_llada2_moe.py": _REMOTE_CONFIG,
    "modeling_llada2_moe.py": _REMOTE_MODELING,
}


def tiny_llada2_config(
    vocab_size: int, mask_id: int, eos_id: int, **overrides: Any
) -> dict[str, Any]:
    """The tiny folder's config.json as a dict (checkpoint field names and layout)."""
    cfg = dict(LLADA2_MINI_CONFIG)
    cfg.update(TINY_LLADA2)
    cfg.update(
        {
            "vocab_size": vocab_size,
            "pad_token_id": eos_id,
            "eos_token_id": eos_id,
            "mask_token_id": mask_id,
        }
    )
    cfg.update(overrides)
    cfg["rotary_dim"] = int(cfg["head_dim"] * cfg["partial_rotary_factor"])
    return cfg


def checkpoint_weight_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of a LLaDA2-MoE checkpoint with this config: name -> shape."""
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.word_embeddings.weight": (cfg["vocab_size"], h),
        "model.norm.weight": (h,),
        "lm_head.weight": (cfg["vocab_size"], h),
    }

    def mlp(prefix: str, inter: int) -> None:
        shapes[f"{prefix}.gate_proj.weight"] = (inter, h)
        shapes[f"{prefix}.up_proj.weight"] = (inter, h)
        shapes[f"{prefix}.down_proj.weight"] = (h, inter)

    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}"
        shapes[f"{p}.input_layernorm.weight"] = (h,)
        shapes[f"{p}.post_attention_layernorm.weight"] = (h,)
        shapes[f"{p}.attention.query_key_value.weight"] = ((heads + 2 * kv) * hd, h)
        if cfg.get("use_qkv_bias"):
            shapes[f"{p}.attention.query_key_value.bias"] = ((heads + 2 * kv) * hd,)
        if cfg.get("use_qk_norm"):
            shapes[f"{p}.attention.query_layernorm.weight"] = (hd,)
            shapes[f"{p}.attention.key_layernorm.weight"] = (hd,)
        shapes[f"{p}.attention.dense.weight"] = (h, heads * hd)
        if cfg.get("use_bias"):
            shapes[f"{p}.attention.dense.bias"] = (h,)
        if cfg.get("num_experts") and n >= cfg["first_k_dense_replace"]:
            shapes[f"{p}.mlp.gate.weight"] = (cfg["num_experts"], h)
            shapes[f"{p}.mlp.gate.expert_bias"] = (cfg["num_experts"],)
            for e in range(cfg["num_experts"]):
                mlp(f"{p}.mlp.experts.{e}", cfg["moe_intermediate_size"])
            if cfg.get("num_shared_experts"):
                mlp(
                    f"{p}.mlp.shared_experts",
                    cfg["moe_intermediate_size"] * cfg["num_shared_experts"],
                )
        else:
            mlp(f"{p}.mlp", cfg["intermediate_size"])
    return shapes


def _random_weights(cfg: dict[str, Any], seed: int) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in checkpoint_weight_shapes(cfg).items():
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith("expert_bias"):
            t = 0.05 * torch.randn(shape, generator=gen)
        elif name.endswith(".bias") or name == "model.word_embeddings.weight":
            t = 0.02 * torch.randn(shape, generator=gen)
        else:  # matrices: twice the unit fan-in scale
            t = 2.0 * torch.randn(shape, generator=gen) / shape[-1] ** 0.5
        out[name] = t.contiguous()
    return out


def _write_tokenizer(path: Path) -> tuple[int, int, int]:
    """Byte-level tokenizer plus ``<|mask|>``: returns (vocab size, mask id, eos id)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = byte_vocab()
    mask_id = len(vocab)
    vocab[MASK_TOKEN] = mask_id
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(MASK_TOKEN, special=True)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",  # as in LLaDA2.0: pad and EOS share an id
        mask_token=MASK_TOKEN,
    )
    fast.save_pretrained(str(path))
    return len(vocab), mask_id, int(vocab["</s>"])


def make_tiny_llada2(
    path: str | Path,
    *,
    seed: int = 0,
    remote_code: bool = True,
    weights: dict[str, Any] | None = None,
    **config_overrides: Any,
) -> Path:
    """Create a tiny LLaDA2-MoE folder at ``path`` (see the module docstring).

    ``remote_code`` writes the stand-ins for the checkpoint's own Python files.
    ``weights`` replaces the random tensors (name -> tensor, checkpoint names).
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokens, mask_id, eos_id = _write_tokenizer(path)
    vocab_size = -(-(tokens) // 8) * 8  # padded like the real embedding (157184 > tokenizer)
    cfg = tiny_llada2_config(vocab_size, mask_id, eos_id, **config_overrides)
    cfg["transformers_version"] = "4.52.3"
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": eos_id, "pad_token_id": eos_id}, indent=2) + "\n"
    )
    tensors = weights if weights is not None else _random_weights(cfg, seed)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    if remote_code:
        for name, text in REMOTE_CODE_FILES.items():
            (path / name).write_text(text)
    return path.resolve()
