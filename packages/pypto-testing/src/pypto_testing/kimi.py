"""Tiny Kimi-Linear folders in the published checkpoints' format.

What a hub download of ``moonshotai/Kimi-Linear-48B-A3B-Instruct`` (or ``-Base``) holds,
scaled down:

* config.json as the repo writes it: ``model_type: kimi_linear`` with the repo's own
  ``auto_map`` (``configuration_kimi.KimiLinearConfig``, ``modeling_kimi.KimiLinearModel``,
  ``modeling_kimi.KimiLinearForCausalLM``), the layer plan in a ``linear_attn_config`` dict
  (1-based ``kda_layers`` / ``full_attn_layers``, ``num_heads``, ``head_dim``,
  ``short_conv_kernel_size``), the MoE in the repo's spelling (``num_experts``,
  ``num_experts_per_token``, ``num_shared_experts``, ``moe_renormalize``,
  ``moe_router_activation_func``, ``first_k_dense_replace``, ``moe_layer_freq``,
  ``num_expert_group``, ``use_grouped_topk``), ``mla_use_nope``, ``model_max_length``,
  ``num_nextn_predict_layers``, ``rope_theta`` / ``rope_scaling: null``, ``head_dim`` =
  hidden / heads;
* weights under the published names: KDA layers ``self_attn.{q,k,v}_proj``,
  ``self_attn.{q,k,v}_conv1d`` (three depthwise convolutions), ``self_attn.f_a_proj`` /
  ``f_b_proj`` / ``A_log`` / ``dt_bias`` (the forget gate, flat under ``self_attn``),
  ``b_proj``, ``g_a_proj`` / ``g_b_proj``, ``o_norm``, ``o_proj``; MLA layers
  ``self_attn.q_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``,
  ``o_proj``; the dense first layer ``mlp.{gate,up,down}_proj``; MoE layers
  ``block_sparse_moe.gate.weight`` / ``.gate.e_score_correction_bias``, one
  ``block_sparse_moe.experts.E.w1/w2/w3`` per expert and
  ``block_sparse_moe.shared_experts.*``. Stored in bfloat16 except ``A_log`` and
  ``dt_bias`` (float32), as the release stores them; sharded with a
  ``model.safetensors.index.json``;
* the repo's own Python (``configuration_kimi.py``, ``modeling_kimi.py``,
  ``tokenization_kimi.py``, and the tokenizer's ``auto_map``), here as files that raise
  when imported: a test that loads through a pinned preset proves they never ran;
* a byte-level tokenizer (``tokenizer.json``) instead of the release's ``tiktoken.model``.

The weights come from transformers' native ``KimiLinearForCausalLM`` with random values
drawn wider than its init (so greedy decoding does not repeat one token) and rounded to
bfloat16; the conversion to the published names is written out here, from the published
inventory, rather than taken from ``save_pretrained`` (which in 5.24 also renames the
dense layer's ``mlp.*`` to ``block_sparse_moe.*``, a name the release does not have).
``reference_path`` writes the same weights under the native names with a native
config.json: what native transformers loads as the reference. Needs the ``models`` extra.
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
    "KIMI_LINEAR_48B_A3B_CONFIG",
    "SHIPPED_CODE_FILES",
    "SHIPPED_CODE_MARKER",
    "TINY_KIMI_LINEAR",
    "kimi_layer_plan",
    "make_tiny_kimi_linear",
    "published_state_dict",
    "read_checkpoint",
    "tiny_kimi_linear_config",
]

#: The published config.json of moonshotai/Kimi-Linear-48B-A3B-Instruct as the hub serves
#: it (the -Base repo is the same architecture): the full-size plan config tests read
#: (27 layers; no weights are ever built at this size).
KIMI_LINEAR_48B_A3B_CONFIG: dict[str, Any] = {
    "architectures": ["KimiLinearForCausalLM"],
    "auto_map": {
        "AutoConfig": "configuration_kimi.KimiLinearConfig",
        "AutoModel": "modeling_kimi.KimiLinearModel",
        "AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM",
    },
    "bos_token_id": 163584,
    "dtype": "bfloat16",
    "eos_token_id": 163586,
    "first_k_dense_replace": 1,
    "head_dim": 72,
    "hidden_act": "silu",
    "hidden_size": 2304,
    "initializer_range": 0.02,
    "intermediate_size": 9216,
    "kv_lora_rank": 512,
    "linear_attn_config": {
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
        "head_dim": 128,
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "num_heads": 32,
        "short_conv_kernel_size": 4,
    },
    "mla_use_nope": True,
    "model_max_length": 1048576,
    "model_type": "kimi_linear",
    "moe_intermediate_size": 1024,
    "moe_layer_freq": 1,
    "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid",
    "num_attention_heads": 32,
    "num_expert_group": 1,
    "num_experts": 256,
    "num_experts_per_token": 8,
    "num_hidden_layers": 27,
    "num_key_value_heads": 32,
    "num_nextn_predict_layers": 0,
    "num_shared_experts": 1,
    "pad_token_id": 163839,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "routed_scaling_factor": 2.446,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "transformers_version": "4.57.1",
    "use_cache": True,
    "use_grouped_topk": True,
    "v_head_dim": 128,
    "vocab_size": 163840,
}

#: Kimi-Linear-48B-A3B's config.json shape (27 layers: KDA at 1-3, 5-7, ..., MLA at 4, 8,
#: ..., 24, 27; layer 0 dense, the rest MoE with 256 experts top-8 and one shared expert)
#: scaled down to 5 layers: KDA at 1, 2, 4, MLA at 3 and 5 (the last layer MLA, as in
#: the release), layer 0 dense.
TINY_KIMI_LINEAR: dict[str, Any] = {
    "architectures": ["KimiLinearForCausalLM"],
    "auto_map": {
        "AutoConfig": "configuration_kimi.KimiLinearConfig",
        "AutoModel": "modeling_kimi.KimiLinearModel",
        "AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM",
    },
    "bos_token_id": 1,
    "dtype": "bfloat16",
    "eos_token_id": 2,
    "first_k_dense_replace": 1,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 96,
    "kv_lora_rank": 32,
    "linear_attn_config": {
        "full_attn_layers": [3, 5],
        "head_dim": 16,
        "kda_layers": [1, 2, 4],
        "num_heads": 4,
        "short_conv_kernel_size": 4,
    },
    "mla_use_nope": True,
    "model_max_length": 4096,
    "model_type": "kimi_linear",
    "moe_intermediate_size": 32,
    "moe_layer_freq": 1,
    "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid",
    "num_attention_heads": 4,
    "num_expert_group": 1,
    "num_experts": 8,
    "num_experts_per_token": 2,
    "num_hidden_layers": 5,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 0,
    "num_shared_experts": 1,
    "pad_token_id": 0,
    "q_lora_rank": None,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "routed_scaling_factor": 2.446,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "transformers_version": "4.57.1",
    "use_cache": True,
    "use_grouped_topk": True,
    "v_head_dim": 16,
    "vocab_size": 259,
}

#: The first line of every stand-in for the repo's own Python: importing one raises.
SHIPPED_CODE_MARKER = "the checkpoint's shipped code ran"
SHIPPED_CODE_FILES = ("configuration_kimi.py", "modeling_kimi.py", "tokenization_kimi.py")
_SHIPPED_CODE = f'raise RuntimeError("{SHIPPED_CODE_MARKER}: {{name}}")\n'

_FP32_STORED = re.compile(r"\.self_attn\.(A_log|dt_bias)$")


def tiny_kimi_linear_config(**overrides: Any) -> dict[str, Any]:
    """The tiny published-format config.json as a dict (``overrides`` replace top-level
    fields; ``linear_attn_config`` is replaced whole)."""
    cfg = copy.deepcopy(TINY_KIMI_LINEAR)
    cfg.update(copy.deepcopy(overrides))
    return cfg


def kimi_layer_plan(cfg: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(attention type, MLP type) per layer, read from a published-format config the way
    the published modeling reads it: layer ``i`` is KDA when ``i + 1`` is in
    ``kda_layers``; MoE when the config has experts, ``i >= first_k_dense_replace`` and
    ``i % moe_layer_freq == 0``. Written independently of pypto-models-kimi on purpose."""
    n = int(cfg["num_hidden_layers"])
    lac = cfg["linear_attn_config"]
    kda = set(lac["kda_layers"])
    attn = ["linear_attention" if i + 1 in kda else "full_attention" for i in range(n)]
    first = int(cfg.get("first_k_dense_replace", 0))
    freq = int(cfg.get("moe_layer_freq", 1))
    moe = cfg.get("num_experts") is not None
    mlp = ["sparse" if moe and i >= first and i % freq == 0 else "dense" for i in range(n)]
    return attn, mlp


def _native_config(cfg: dict[str, Any]) -> Any:
    """transformers' native config for a published-format dict, field by field."""
    from transformers import KimiLinearConfig

    attn, mlp = kimi_layer_plan(cfg)
    lac = cfg["linear_attn_config"]
    return KimiLinearConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        moe_intermediate_size=cfg["moe_intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        n_shared_experts=cfg["num_shared_experts"],
        routed_scaling_factor=cfg["routed_scaling_factor"],
        kv_lora_rank=cfg["kv_lora_rank"],
        q_lora_rank=cfg["q_lora_rank"],
        qk_rope_head_dim=cfg["qk_rope_head_dim"],
        v_head_dim=cfg["v_head_dim"],
        qk_nope_head_dim=cfg["qk_nope_head_dim"],
        n_group=cfg["num_expert_group"] if cfg.get("use_grouped_topk", True) else 1,
        topk_group=cfg["topk_group"] if cfg.get("use_grouped_topk", True) else 1,
        num_experts_per_tok=cfg["num_experts_per_token"],
        norm_topk_prob=cfg["moe_renormalize"],
        hidden_act=cfg["hidden_act"],
        max_position_embeddings=cfg["model_max_length"],
        rms_norm_eps=cfg["rms_norm_eps"],
        pad_token_id=cfg["pad_token_id"],
        bos_token_id=cfg["bos_token_id"],
        eos_token_id=cfg["eos_token_id"],
        tie_word_embeddings=cfg["tie_word_embeddings"],
        num_local_experts=cfg["num_experts"],
        layer_types=attn,
        mlp_layer_types=mlp,
        linear_head_dim=lac["head_dim"],
        linear_num_heads=lac["num_heads"],
        linear_conv_kernel_dim=lac["short_conv_kernel_size"],
    )


def published_state_dict(
    native: dict[str, Any], attn_types: list[str], mlp_types: list[str]
) -> dict[str, Any]:
    """Native ``KimiLinearForCausalLM`` state-dict tensors under the published names."""
    out: dict[str, Any] = {}
    layer_re = re.compile(r"^model\.layers\.(\d+)\.(.*)$")
    for name, t in native.items():
        m = layer_re.match(name)
        if m is None:
            out[name] = t
            continue
        i, rest = int(m.group(1)), m.group(2)
        prefix = f"model.layers.{i}."
        if attn_types[i] == "linear_attention" and rest.startswith("self_attn."):
            if rest == "self_attn.conv1d.weight":
                q, k, v = t.chunk(3, dim=0)
                out[prefix + "self_attn.q_conv1d.weight"] = q
                out[prefix + "self_attn.k_conv1d.weight"] = k
                out[prefix + "self_attn.v_conv1d.weight"] = v
                continue
            rest = rest.replace("self_attn.forget_gate.", "self_attn.")
        if mlp_types[i] == "sparse" and rest.startswith("mlp."):
            if rest == "mlp.experts.gate_up_proj":
                half = t.shape[1] // 2
                for e in range(t.shape[0]):
                    out[prefix + f"block_sparse_moe.experts.{e}.w1.weight"] = t[e, :half]
                    out[prefix + f"block_sparse_moe.experts.{e}.w3.weight"] = t[e, half:]
                continue
            if rest == "mlp.experts.down_proj":
                for e in range(t.shape[0]):
                    out[prefix + f"block_sparse_moe.experts.{e}.w2.weight"] = t[e]
                continue
            rest = "block_sparse_moe." + rest[len("mlp.") :]
        out[prefix + rest] = t
    return {k: v.contiguous().clone() for k, v in out.items()}


def _widen(model: Any, seed: int) -> None:
    """Random values wider than transformers' init; norm weights off 1 so that a swapped
    norm would show; the forget gate's A_log / dt_bias keep their (random) native init."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                continue
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * (0.05 if "embed" in name else 0.2))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Every tensor of a folder's safetensors files, by stored name (tests compare)."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def make_tiny_kimi_linear(
    path: str | Path,
    *,
    shards: int = 2,
    seed: int = 0,
    reference_path: str | Path | None = None,
    shipped_code: bool = True,
    **overrides: Any,
) -> Path:
    """Write a tiny Kimi-Linear folder in the published format at ``path``; return it
    resolved.

    ``overrides`` replace config.json fields (the layer plan comes from
    ``linear_attn_config`` / ``first_k_dense_replace`` / ``moe_layer_freq``).
    ``reference_path``: also write a native float32 folder holding the same weights under
    transformers' own names. ``shipped_code``: also write the stand-ins for the repo's
    Python and the tokenizer's ``auto_map`` (see the module docstring).
    """
    import torch
    from transformers import GenerationConfig, KimiLinearForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_byte_tokenizer(path)
    cfg = tiny_kimi_linear_config(vocab_size=vocab, **overrides)
    attn, mlp = kimi_layer_plan(cfg)
    torch.manual_seed(seed)
    model = KimiLinearForCausalLM(_native_config(cfg)).eval()
    _widen(model, seed)
    native: dict[str, Any] = {}
    with torch.no_grad():
        for name, t in model.state_dict().items():
            # What the release stores: bfloat16, except the forget gate's A_log / dt_bias.
            value = t.float() if _FP32_STORED.search(name) else t.to(torch.bfloat16)
            native[name] = value
            t.copy_(value.float())  # the model now holds exactly what is stored
    published = published_state_dict(native, attn, mlp)
    write_sharded(path, published, shards)
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(str(path))
    if shipped_code:
        for name in SHIPPED_CODE_FILES:
            (path / name).write_text(_SHIPPED_CODE.format(name=name))
        tok_cfg_path = path / "tokenizer_config.json"
        tok_cfg = json.loads(tok_cfg_path.read_text())
        tok_cfg["auto_map"] = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
        tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")
    if reference_path is not None:
        ref = Path(reference_path)
        ref.mkdir(parents=True, exist_ok=True)
        write_byte_tokenizer(ref)
        model.config.save_pretrained(str(ref))
        ref_cfg = json.loads((ref / "config.json").read_text())
        ref_cfg["dtype"] = "float32"
        (ref / "config.json").write_text(json.dumps(ref_cfg, indent=2) + "\n")
        write_sharded(ref, {k: v.float() for k, v in native.items()}, 1)
        GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(str(ref))
    return path.resolve()
