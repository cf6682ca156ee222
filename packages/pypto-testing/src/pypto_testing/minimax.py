"""Tiny MiniMax M2.7 and M3 folders in the published checkpoints' formats.

What a hub download of ``MiniMaxAI/MiniMax-M2.7`` or ``MiniMaxAI/MiniMax-M3`` holds,
scaled down:

* M2.7: a flat ``minimax_m2`` config.json written the way the checkpoint writes it
  (``rotary_dim`` and ``rope_theta`` at the top level, ``use_mtp`` / ``num_mtp_modules``,
  ``qk_norm_type: per_layer``, ``scoring_func: sigmoid``, the hub's own ``auto_map``);
  weights under the checkpoint's names (``block_sparse_moe.experts.N.w1/w2/w3``,
  ``block_sparse_moe.gate``, ``block_sparse_moe.e_score_correction_bias``), sharded with a
  ``model.safetensors.index.json``; the MTP modules' weights stored past the last decoder
  layer (``model.layers.{num_hidden_layers + i}.*``). ``weights="fp8"`` writes them as the
  FP8 release does: attention and expert matrices in ``float8_e4m3fn`` with one float32
  ``weight_scale_inv`` per 128x128 block (dequantised value = fp8 value x scale), router
  (``gate``) and ``e_score_correction_bias`` in float32, embeddings, norms and ``lm_head``
  in bfloat16, and a ``quantization_config`` in config.json.
* M3: the vision-language checkpoint's nested config.json (``model_type: minimax_m3_vl``;
  the text part in its legacy spelling: ``sparse_attention_config``, ``moe_layer_freq``,
  ``hidden_act: swigluoai``; a CLIP-style ``vision_config``), weights under
  ``language_model.model.*`` / ``language_model.lm_head`` beside the vision tower's and
  projector's, saved from transformers' native ``MiniMaxM3SparseForConditionalGeneration``.

Random weights are drawn wider than transformers' init (matrices std 0.2), so greedy
decoding does not repeat one token. It lives here, not in pypto-models-minimax, so the
model package's library code never imports test helpers; it uses transformers' native
classes only. Needs the ``models`` extra.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from .checkpoints import write_sharded
from .models import write_byte_tokenizer

__all__ = [
    "FP8_BLOCK",
    "TINY_M3_TEXT",
    "TINY_M27",
    "fp8_block_dequantize",
    "fp8_block_quantize",
    "make_tiny_minimax_m3",
    "make_tiny_minimax_m27",
    "read_checkpoint",
    "tiny_minimax_m3_config",
    "tiny_minimax_m27_config",
]

FP8_BLOCK = 128

#: MiniMax-M2.7's config.json shape (62 layers, hidden 3072, 48/8 heads x 128, rotary 64,
#: 256 experts top-8, intermediate 1536, 3 MTP modules) scaled down. Hidden 256 and
#: intermediate 192 make the FP8 scale grid have full *and* partial 128-blocks.
TINY_M27: dict[str, Any] = {
    "architectures": ["MiniMaxM2ForCausalLM"],
    "auto_map": {
        "AutoConfig": "configuration_minimax_m2.MiniMaxM2Config",
        "AutoModelForCausalLM": "modeling_minimax_m2.MiniMaxM2ForCausalLM",
    },
    "model_type": "minimax_m2",
    "attn_type_list": [1, 1],
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 256,
    "intermediate_size": 192,
    "max_position_embeddings": 512,
    "mtp_transformer_layers": 1,
    "num_attention_heads": 4,
    "num_experts_per_tok": 3,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "num_mtp_modules": 1,
    "qk_norm_type": "per_layer",
    "rms_norm_eps": 1e-06,
    "rope_theta": 5000000,
    "rotary_dim": 32,
    "scoring_func": "sigmoid",
    "shared_intermediate_size": 0,
    "tie_word_embeddings": False,
    "use_mtp": True,
    "use_qk_norm": True,
    "use_routing_bias": True,
    "vocab_size": 259,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "bfloat16",
}

FP8_QUANTIZATION_CONFIG: dict[str, Any] = {
    "activation_scheme": "dynamic",
    "fmt": "float8_e4m3fn",
    "quant_method": "fp8",
    "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
    "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"],
}

#: MiniMax-M3's text_config (60 layers: 3 dense then MoE with a shared expert; sparse
#: attention on the MoE layers: 4 index heads x 128, blocks of 128 keys, top-16 + 1 local)
#: scaled down: 3 layers (1 dense), blocks of 4 keys, top-2 + 1 local, so a prompt of a
#: dozen tokens already drops blocks.
TINY_M3_TEXT: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 259,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-06,
    "use_gemma_norm": True,
    "attention_output_gate": False,
    "rope_theta": 5000000,
    "rotary_dim": 8,
    "partial_rotary_factor": 0.5,
    "hidden_act": "swigluoai",
    "use_qk_norm": True,
    "tie_word_embeddings": False,
    "dense_intermediate_size": 64,
    "shared_intermediate_size": 32,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "scoring_func": "sigmoid",
    "use_routing_bias": True,
    "moe_layer_freq": [0, 1, 1],
    "qk_norm_type": "per_head",
    "num_mtp_modules": 1,
    "num_nextn_predict_layers": 1,
    "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0,
    "routed_scaling_factor": 2.0,
    "sparse_attention_config": {
        "use_sparse_attention": True,
        "sparse_index_dim": 16,
        "sparse_num_index_heads": 2,
        "sparse_topk_blocks": 2,
        "sparse_block_size": 4,
        "sparse_disable_index_value": [0, 1, 1],
        "sparse_score_type": "max",
        "sparse_init_block": 0,
        "sparse_local_block": 1,
        "sparse_attention_freq": [0, 1, 1],
    },
    "architectures": ["MiniMaxM3SparseForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

_M3_TOP: dict[str, Any] = {
    "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
    "auto_map": {"AutoConfig": "configuration_minimax_m3_vl.MiniMaxM3VLConfig"},
    "model_type": "minimax_m3_vl",
    "vision_config": {
        "hidden_size": 32,
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "intermediate_size": 64,
        "patch_size": 14,
        "image_size": 56,
        "projection_dim": 64,
        "position_embedding_type": "rope",
        "rope_mode": "3d",
        "rope_theta": 10000.0,
        "attention_dropout": 0.0,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-05,
        "model_type": "clip_vision_model",
        "num_channels": 3,
        "img_token_compression_config": {
            "image_token_compression_method": "patch_merge",
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    },
    "image_token_index": 200025,
    "video_token_index": 200026,
    "multimodal_projector_bias": True,
    "projector_hidden_act": "gelu",
    "projector_hidden_size": 64,
    "torch_dtype": "bfloat16",
}

# Matrices the FP8 release stores in float8 (attention projections and the experts).
_FP8_WEIGHT = re.compile(r"(self_attn\.[qkvo]_proj|experts\.\d+\.w[123])\.weight$")


def tiny_minimax_m27_config(**overrides: Any) -> dict[str, Any]:
    """The tiny M2.7 config.json as a dict (``overrides`` replace top-level fields)."""
    cfg = copy.deepcopy(TINY_M27)
    cfg.update(overrides)
    if "num_hidden_layers" in overrides and "attn_type_list" not in overrides:
        cfg["attn_type_list"] = [1] * int(cfg["num_hidden_layers"])
    return cfg


def tiny_minimax_m3_config(**text_overrides: Any) -> dict[str, Any]:
    """The tiny M3 VL config.json as a dict (``text_overrides`` replace text_config fields)."""
    cfg = copy.deepcopy(_M3_TOP)
    text = copy.deepcopy(TINY_M3_TEXT)
    text.update(text_overrides)
    cfg["text_config"] = text
    return cfg


def fp8_block_quantize(weight: Any, block: int = FP8_BLOCK) -> tuple[Any, Any]:
    """(float8_e4m3fn weight, float32 scale per ``block`` x ``block`` tile), DeepSeek-style:
    scale = tile amax / 448, stored value = weight / scale; edge tiles may be partial."""
    import torch

    w = weight.float()
    rows, cols = w.shape
    gr, gc = -(-rows // block), -(-cols // block)
    scales = torch.empty(gr, gc, dtype=torch.float32)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    finfo = torch.finfo(torch.float8_e4m3fn)
    for i in range(gr):
        for j in range(gc):
            tile = w[i * block : (i + 1) * block, j * block : (j + 1) * block]
            scale = max(float(tile.abs().max()) / finfo.max, 1e-12)
            scales[i, j] = scale
            q[i * block : (i + 1) * block, j * block : (j + 1) * block] = (tile / scale).to(
                torch.float8_e4m3fn
            )
    return q, scales


def fp8_block_dequantize(q: Any, scales: Any, block: int = FP8_BLOCK) -> Any:
    """The reference dequantisation, tile by tile (float32): what a loader must produce."""
    import torch

    out = torch.empty(q.shape, dtype=torch.float32)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            rs, cs = slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block)
            out[rs, cs] = q[rs, cs].float() * float(scales[i, j])
    return out


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Every tensor of a folder's safetensors files, by checkpoint name (tests compare)."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _widen(model: Any, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or p.dim() < 2:
                continue
            p.copy_(torch.randn(p.shape, generator=g) * (0.05 if "embed" in name else 0.2))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)


def _native_state(model: Any, tmp: Path) -> dict[str, Any]:
    """The checkpoint-named tensors transformers writes for ``model`` (its save reverses
    the load-time renames and merges)."""
    model.save_pretrained(str(tmp), safe_serialization=True)
    tensors = read_checkpoint(tmp)
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    return tensors


def make_tiny_minimax_m27(
    path: str | Path,
    *,
    weights: str = "bf16",
    mtp: bool = True,
    shards: int = 2,
    seed: int = 0,
    reference_path: str | Path | None = None,
    **overrides: Any,
) -> Path:
    """Write a tiny MiniMax-M2.7 folder at ``path``; return it resolved.

    ``weights``: "bf16" (the BF16 release), "float32", or "fp8" (the FP8 release, see
    the module docstring). ``mtp``: also store the MTP modules' weights, as the release
    does. ``reference_path``: also write a plain float32 ``minimax_m2`` folder holding the
    weights the checkpoint *means* (FP8 dequantised, no MTP): what native transformers
    loads as the reference.
    """
    import torch
    from transformers import GenerationConfig, MiniMaxM2Config, MiniMaxM2ForCausalLM

    if weights not in ("bf16", "float32", "fp8"):
        raise ValueError(f"weights must be bf16, float32 or fp8, not {weights!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_byte_tokenizer(path)
    cfg = tiny_minimax_m27_config(vocab_size=vocab, **overrides)
    native_cfg = {k: v for k, v in cfg.items() if k not in ("auto_map", "quantization_config")}
    torch.manual_seed(seed)
    model = MiniMaxM2ForCausalLM(MiniMaxM2Config.from_dict(native_cfg)).eval()
    _widen(model, seed)
    tensors = _native_state(model, path / "_native")
    n_layers = int(cfg["num_hidden_layers"])
    if mtp:
        # One MTP module per extra layer index, shaped like a decoder layer (what serving
        # engines read as the speculative layers); the modeling never uses them.
        g = torch.Generator().manual_seed(seed + 1)
        layer0 = {k: v for k, v in tensors.items() if k.startswith("model.layers.0.")}
        for i in range(int(cfg.get("num_mtp_modules", 1))):
            for k, v in layer0.items():
                name = k.replace("model.layers.0.", f"model.layers.{n_layers + i}.", 1)
                tensors[name] = torch.randn(v.shape, generator=g).to(v.dtype) * 0.2
    reference: dict[str, Any] = {}  # what each stored tensor means, in float32
    out: dict[str, Any] = {}
    for name, t in tensors.items():
        if weights == "float32":
            out[name] = t.float()
        elif weights == "bf16" or not _FP8_WEIGHT.search(name):
            keep32 = weights == "fp8" and (
                name.endswith("block_sparse_moe.gate.weight")
                or name.endswith("e_score_correction_bias")
            )
            out[name] = t.float() if keep32 else t.to(torch.bfloat16)
        else:
            q, scale = fp8_block_quantize(t)
            out[name] = q
            out[name[: -len("weight")] + "weight_scale_inv"] = scale
            reference[name] = fp8_block_dequantize(q, scale)
            continue
        reference[name] = out[name].float()
    write_sharded(path, out, shards)
    if weights == "fp8":
        cfg["quantization_config"] = copy.deepcopy(FP8_QUANTIZATION_CONFIG)
    cfg["torch_dtype"] = "float32" if weights == "float32" else "bfloat16"
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(str(path))
    if reference_path is not None:
        _write_reference(Path(reference_path), model, reference, n_layers)
    return path.resolve()


def _write_reference(path: Path, model: Any, tensors: dict[str, Any], n_layers: int) -> None:
    """A native float32 folder from checkpoint-named tensors (MTP layers dropped)."""
    from transformers import GenerationConfig

    keep = {
        k: v
        for k, v in tensors.items()
        if not (m := re.match(r"model\.layers\.(\d+)\.", k)) or int(m.group(1)) < n_layers
    }
    path.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(path)
    model.config.save_pretrained(str(path))
    cfg = json.loads((path / "config.json").read_text())
    cfg["dtype"] = "float32"
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_sharded(path, {k: v.float() for k, v in keep.items()}, 1)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(str(path))


def make_tiny_minimax_m3(
    path: str | Path,
    *,
    weights: str = "bf16",
    shards: int = 2,
    seed: int = 0,
    **text_overrides: Any,
) -> Path:
    """Write a tiny MiniMax-M3 (vision-language) folder at ``path``; return it resolved.

    ``weights``: "bf16" (the release's dtype) or "float32".
    """
    import torch
    from transformers import GenerationConfig
    from transformers.models.minimax_m3_vl import (
        MiniMaxM3SparseForConditionalGeneration,
        MiniMaxM3VLConfig,
    )

    if weights not in ("bf16", "float32"):
        raise ValueError(f"weights must be bf16 or float32, not {weights!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_byte_tokenizer(path)
    cfg = tiny_minimax_m3_config(vocab_size=vocab, **text_overrides)
    native_cfg = {k: v for k, v in copy.deepcopy(cfg).items() if k != "auto_map"}
    torch.manual_seed(seed)
    model = MiniMaxM3SparseForConditionalGeneration(MiniMaxM3VLConfig.from_dict(native_cfg))
    _widen(model.eval(), seed)
    tensors = _native_state(model, path / "_native")
    dtype = torch.float32 if weights == "float32" else torch.bfloat16
    out = {
        k: (v.float() if k.endswith("e_score_correction_bias") else v.to(dtype))
        for k, v in tensors.items()
    }
    write_sharded(path, out, shards)
    cfg["torch_dtype"] = "float32" if weights == "float32" else "bfloat16"
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(str(path))
    return path.resolve()
