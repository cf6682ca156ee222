"""Tiny folders of the recurrent / hybrid / vision-language architectures transformers ships.

Why this exists: engineers port whatever is new this year (Gated DeltaNet and KDA hybrids,
Mamba2 hybrids, short-conv hybrids, VL checkpoints), and a capture path is only proven for
an architecture when a folder of it, built with transformers' *own* config and model
classes, decodes through every arm. Each entry here is the smallest config of one model
type that still holds every layer type the architecture has (linear attention *and* full
attention, Mamba *and* attention, MoE *and* dense MLP, ...), with a sliding window short
enough that a test decodes past it.

Random weights collapse onto one token under greedy decoding (every logit nearly equal),
which would make "tokens equal eager" vacuous; :func:`make_tiny_architecture` therefore
re-draws the matrices at a scale where logits spread (the approach of ``minimax._widen``).

An entry whose model type the installed transformers lacks is reported by
:func:`available` with the reason, so tests skip with it rather than fail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .models import SPECIAL_TOKENS, write_byte_tokenizer

__all__ = [
    "ARCHITECTURES",
    "DECODER_ARCHITECTURES",
    "MATRIX_ARMS",
    "SPARSE_ARCHITECTURES",
    "VL_ARCHITECTURES",
    "architecture_config",
    "available",
    "expected_outcome",
    "make_tiny_architecture",
    "own_cache_class",
    "spread_weights",
]

_VOCAB = len(SPECIAL_TOKENS) + 256
_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_ATTN = {"num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}

# Gated DeltaNet layers (Qwen3-Next / Qwen3.5 / Qwen3.6): 2 key heads shared by 4 value
# heads (the GQA-like grouping of the published models), head dims 16, a 4-tap conv.
_GATED_DELTANET = {
    "head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
}

# DeepSeek-V3.2-style sparse attention (GLM-MoE-DSA, HY-V4 share the config names): MLA
# latents, a 16-head indexer picking 4 keys, a dense first layer then MoE.
_DSA = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "index_head_dim": 16,
    "index_n_heads": 16,
    "index_topk": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
}

# model type -> (what it mixes, config values). Values are the installed config class's own
# argument names; widths are the smallest that keep every code path (GQA, grouped SSM heads,
# MoE top-k < experts).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "qwen3_next": {
        "mixes": "Gated DeltaNet linear attention + gated full attention + MoE",
        "config": {
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "full_attention"],
            **_GATED_DELTANET,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [0],
            **_ATTN,
        },
    },
    "qwen3_5_text": {
        "mixes": "Gated DeltaNet linear attention + gated full attention (Qwen3.5 / Qwen3.6 dense)",
        "config": {
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "full_attention"],
            **_GATED_DELTANET,
            **_ATTN,
        },
    },
    "qwen3_5_moe_text": {
        "mixes": "Gated DeltaNet linear attention + gated full attention + MoE (Qwen3.5 / 3.6 MoE)",
        "config": {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "full_attention"],
            **_GATED_DELTANET,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            **_ATTN,
        },
    },
    "kimi_linear": {
        "mixes": "KDA linear attention + MLA full attention + MoE (Kimi-Linear)",
        "config": {
            "hidden_size": 64,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "full_attention"],
            "mlp_layer_types": ["dense", "sparse"],
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "kv_lora_rank": 16,
            "q_lora_rank": None,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "linear_head_dim": 16,
            "linear_num_heads": 4,
            "linear_conv_kernel_dim": 4,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "max_position_embeddings": 512,
        },
    },
    "mamba": {
        "mixes": "Mamba SSM",
        "config": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "state_size": 8,
            "num_hidden_layers": 2,
            "conv_kernel": 4,
            "time_step_rank": 4,
        },
    },
    "falcon_mamba": {
        "mixes": "Mamba SSM (RMS-normed B/C/dt)",
        "config": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "state_size": 8,
            "num_hidden_layers": 2,
            "conv_kernel": 4,
            "time_step_rank": 4,
        },
    },
    "mamba2": {
        "mixes": "Mamba2 SSM",
        "config": {
            "hidden_size": 32,
            "num_heads": 4,
            "head_dim": 16,
            "expand": 2,
            "state_size": 16,
            "n_groups": 1,
            "num_hidden_layers": 2,
            "conv_kernel": 4,
            "chunk_size": 16,
            "time_step_rank": 4,
        },
    },
    "jamba": {
        "mixes": "Mamba SSM + attention + MoE",
        "config": {
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "attn_layer_period": 2,
            "attn_layer_offset": 1,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "mamba_d_state": 8,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_dt_rank": 8,
            "use_mamba_kernels": False,
            **_ATTN,
        },
    },
    "bamba": {
        "mixes": "Mamba2 SSM + attention",
        "config": {
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "attn_layer_indices": [1],
            "mamba_n_heads": 4,
            "mamba_d_head": 32,
            "mamba_n_groups": 1,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_chunk_size": 16,
            **_ATTN,
        },
    },
    "nemotron_h": {
        "mixes": "Mamba2 SSM + attention + MoE + dense MLP blocks (Nemotron-H)",
        "config": {
            "hidden_size": 64,
            "layers_block_type": ["mamba", "moe", "attention", "mlp"],  # 5.8 names; 5.2x maps them
            "head_dim": 16,
            "intermediate_size": 96,
            "ssm_state_size": 16,
            "mamba_num_heads": 4,
            "mamba_head_dim": 32,
            "n_groups": 1,
            "expand": 2,
            "conv_kernel": 4,
            "chunk_size": 16,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "moe_intermediate_size": 32,
            "moe_shared_expert_intermediate_size": 32,
            "num_experts_per_tok": 2,
            "mamba_ssm_cache_dtype": "float32",
            **_ATTN,
        },
    },
    "granitemoehybrid": {
        "mixes": "Mamba2 SSM + attention + MoE (Granite 4)",
        "config": {
            "hidden_size": 64,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "layer_types": ["mamba", "attention"],
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "shared_intermediate_size": 32,
            "mamba_n_heads": 4,
            "mamba_d_head": 32,
            "mamba_n_groups": 1,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_chunk_size": 16,
            **_ATTN,
        },
    },
    "falcon_h1": {
        "mixes": "attention and Mamba2 in parallel in every layer (layer type 'hybrid')",
        "config": {
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "head_dim": 16,
            "mamba_d_ssm": 128,
            "mamba_n_heads": 4,
            "mamba_d_head": 32,
            "mamba_n_groups": 1,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_chunk_size": 16,
            **_ATTN,
        },
    },
    "lfm2": {
        "mixes": "short convolutions + attention (LFM2)",
        "config": {
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "layer_types": ["conv", "full_attention"],
            "conv_L_cache": 3,
            "block_auto_adjust_ff_dim": False,
            **_ATTN,
        },
    },
    "lfm2_moe": {
        "mixes": "short convolutions + attention + MoE (LFM2-MoE)",
        "config": {
            "hidden_size": 64,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "num_hidden_layers": 2,
            "layer_types": ["conv", "full_attention"],
            "conv_L_cache": 3,
            "num_dense_layers": 1,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            **_ATTN,
        },
    },
    "zamba2": {
        "mixes": "Mamba2 SSM + a shared attention block (layer type 'hybrid')",
        "config": {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "layers_block_type": ["linear_attention", "hybrid"],
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_ngroups": 1,
            "n_mamba_heads": 4,
            "chunk_size": 16,
            "intermediate_size": 96,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "num_mem_blocks": 1,
            "use_mamba_kernels": False,
            "max_position_embeddings": 512,
        },
    },
    "recurrent_gemma": {
        "mixes": "RG-LRU recurrence + local attention (keeps its own cache inside the model)",
        "refused": {("decode", "graph"): "returned no cache object"},
        "config": {
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "lru_width": 64,
            "attention_window_size": 8,
            "conv1d_width": 4,
            "block_types": ["recurrent", "recurrent", "attention"],
        },
    },
    "minimax": {
        "mixes": "lightning (linear) attention + softmax attention + MoE (MiniMax-Text-01)",
        "refused": {("decode", "graph"): "keeps a cache class of its own (MiniMaxCache)"},
        "config": {
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "head_dim": 16,
            "layer_types": ["linear_attention", "full_attention"],
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "block_size": 16,
            **_ATTN,
        },
    },
    # Sparse attention with a DeepSeek-V3.2-style indexer (DSA): the indexer keeps its own
    # keys in the cache (transformers' DynamicIndexedLayer). 16 indexer heads: the indexer
    # sums ReLU'd per-head scores, and with few heads many positions score exactly 0, where
    # top-k's choice among ties depends on how many candidates there are (a static cache
    # has more: its empty slots), so tokens would differ for a reason that is not the port.
    "glm_moe_dsa": {
        "mixes": "MLA + DSA sparse attention (indexer keys in the cache) + MoE",
        "sparse": True,
        "config": _DSA,
    },
    "hy_v4": {
        "mixes": "MLA + DSA sparse attention (full and shared indexers) + MoE",
        "sparse": True,
        "config": _DSA,
    },
    "qwen4_exp_text": {
        "mixes": "Gated DeltaNet + block-sparse attention (indexer keys and their positions "
        "in the cache) + MoE",
        "sparse": True,
        "refused": {("decode", "graph"): "indexer_position_ids"},
        "config": {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "full_attention_interval": 2,
            "head_dim": 16,
            "intermediate_size": 64,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "indexer_head_dim": 16,
            "indexer_n_heads": 4,
            "indexer_kv_heads": 1,
            "indexer_budget": 8,
            "indexer_compress_ratio": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "hc_lowrank": 8,
            **_ATTN,
        },
    },
    "qwen3_vl": {
        "mixes": "vision-language: Qwen3 text decoder (interleaved MRoPE) + ViT",
        "vl": True,
        "config": {
            "text_config": {
                "hidden_size": 64,
                "intermediate_size": 96,
                "num_hidden_layers": 2,
                "head_dim": 16,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "mrope_section": [2, 3, 3],
                    "mrope_interleaved": True,
                },
                "vocab_size": _VOCAB,
                **_ATTN,
            },
            "vision_config": {
                "depth": 2,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_heads": 2,
                "out_hidden_size": 64,
                "patch_size": 8,
                "temporal_patch_size": 2,
                "spatial_merge_size": 2,
                "num_position_embeddings": 16,
                "deepstack_visual_indexes": [0],
            },
            "image_token_id": 3,
            "video_token_id": 4,
            "vision_start_token_id": 5,
            "vision_end_token_id": 6,
        },
    },
}

#: The (regime, arm) cells the coverage suite runs for every decoder entry, in the order the
#: support matrix prints them.
MATRIX_ARMS: tuple[tuple[str, str], ...] = (
    ("decode", "eager"),
    ("decode", "graph"),
    ("decode", "hf-compile"),
    ("prefill", "eager"),
    ("prefill", "graph"),
)


def expected_outcome(model_type: str, regime: str, arm: str) -> str | None:
    """None when the suite expects the arm to run with tokens equal to eager, else the
    words its one-line refusal must contain (what the support matrix prints)."""
    refused: dict[tuple[str, str], str] = ARCHITECTURES[model_type].get("refused", {})
    return refused.get((regime, arm))


DECODER_ARCHITECTURES = tuple(
    k for k, v in ARCHITECTURES.items() if not v.get("vl") and not v.get("sparse")
)
#: Sparse-attention decoders (an indexer whose keys the cache keeps): decode, eager and graph.
SPARSE_ARCHITECTURES = tuple(k for k, v in ARCHITECTURES.items() if v.get("sparse"))
VL_ARCHITECTURES = tuple(k for k, v in ARCHITECTURES.items() if v.get("vl"))


def available(model_type: str) -> str | None:
    """None when the installed transformers can build ``model_type``, else why not."""
    from transformers import CONFIG_MAPPING

    if model_type not in ARCHITECTURES:
        return f"no tiny config for {model_type!r}"
    if model_type not in CONFIG_MAPPING:
        import transformers

        return f"transformers {transformers.__version__} has no {model_type!r} model type"
    return None


def own_cache_class(model: Any) -> str | None:
    """The name of a cache class of the model's own (e.g. ``Mamba2Cache`` where the installed
    transformers predates the move of SSMs onto its shared cache layers), or None.

    pypto-capture refuses such a model's graph arm in one line; a suite run at an older
    transformers skips the architecture's "ok" cells with this as the reason."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.zeros((1, 1), dtype=torch.long), use_cache=True)
    for name in ("cache", "past_key_values", "cache_params"):
        cache = getattr(out, name, None)
        if cache is not None:
            module = type(cache).__module__ or ""
            return type(cache).__name__ if module.startswith("transformers.models.") else None
    return None


def architecture_config(model_type: str, **overrides: Any) -> Any:
    """The transformers config object of the tiny ``model_type`` (its own config class)."""
    from transformers import AutoConfig

    why = available(model_type)
    if why:
        raise ValueError(why)
    values: dict[str, Any] = json.loads(json.dumps(ARCHITECTURES[model_type]["config"]))
    if not ARCHITECTURES[model_type].get("vl"):
        values.setdefault("vocab_size", _VOCAB)
        values.setdefault("tie_word_embeddings", False)
    else:
        values["text_config"].update(_IDS)
    values.update(_IDS)
    values.update(overrides)
    return AutoConfig.for_model(model_type, **values)


def _model_class(config: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM
    return AutoModelForImageTextToText


def spread_weights(model: Any, seed: int = 0, scale: float = 1.6) -> None:
    """Re-draw every weight matrix so logits spread and greedy decoding does not collapse."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2 or "norm" in name:
                continue
            fan_in = p.shape[-1] if p.dim() == 2 else max(p[0].numel() // p.shape[-2], 1)
            std = (0.5 if "embed" in name else scale) / max(fan_in, 1) ** 0.5
            p.copy_(torch.randn(p.shape, generator=g) * std)


def make_tiny_architecture(
    path: str | Path,
    model_type: str,
    *,
    seed: int = 0,
    scale: float = 1.6,
    dtype: str = "float32",
    **overrides: Any,
) -> Path:
    """A loadable folder of the tiny ``model_type``: config.json, safetensors weights built by
    transformers' own model class, generation_config.json and a byte-level tokenizer."""
    import torch

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(path)
    config = architecture_config(model_type, **overrides)
    torch.manual_seed(seed)
    model = _model_class(config).from_config(config, dtype=getattr(torch, dtype))
    spread_weights(model, seed, scale)
    model.generation_config.pad_token_id = 0
    model.save_pretrained(str(path), safe_serialization=True)
    return path.resolve()
