"""A tiny model folder that implements pypto-bench's diffusion-generate protocol.

Why here and not in pypto-bench: a library must not ship its test helpers (they pulled
a model class and a folder writer into every bench install). The protocol itself
(``diffusion_generate(input_ids, *, gen_length, steps, block_length=None, forward=None)``
returning ``sequences`` and ``num_denoising_steps``) stays documented in pypto-bench;
this module only implements it, duck-typed, so pypto-testing does not depend on
pypto-bench.

``TinyDiffusionLM`` is a masked-diffusion sampler (LLaDA-style low-confidence remasking,
without the bidirectional training) over a tiny Llama body: enough to run the regime for
real in tests. The folder's remote code is two one-line shims importing this module,
which is how model packages ship code; loading it needs ``trust_remote_code`` and
pypto-testing importable. Needs the ``models`` extra (torch, transformers).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

__all__ = [
    "CONFIG_SHIM",
    "MODEL_SHIM",
    "TinyDiffusionConfig",
    "TinyDiffusionLM",
    "TinyDiffusionOutput",
    "diffusion_gemma_available",
    "make_tiny_diffusion_gemma",
    "make_tiny_diffusion_model",
]

#: The shim files written into the folder; transformers imports them as remote code.
CONFIG_SHIM = "configuration_tiny_diffusion.py"
MODEL_SHIM = "modeling_tiny_diffusion.py"
_SHIM_CONFIG = "from pypto_testing.diffusion import TinyDiffusionConfig  # noqa: F401\n"
_SHIM_MODEL = "from pypto_testing.diffusion import TinyDiffusionLM  # noqa: F401\n"


@dataclass
class TinyDiffusionOutput:
    """What the protocol asks ``diffusion_generate`` to return (read by attribute)."""

    sequences: torch.Tensor
    num_denoising_steps: int


class TinyDiffusionConfig(LlamaConfig):
    model_type = "pypto_tiny_diffusion"

    def __init__(self, mask_token_id: int = 0, **kwargs: Any) -> None:
        self.mask_token_id = mask_token_id
        super().__init__(**kwargs)


class TinyDiffusionLM(LlamaForCausalLM):
    config_class = TinyDiffusionConfig

    @torch.no_grad()
    def diffusion_generate(
        self,
        input_ids: torch.Tensor,
        *,
        gen_length: int,
        steps: int,
        block_length: int | None = None,
        forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
        step_observer: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
        **_: Any,
    ) -> TinyDiffusionOutput:
        """Unmask ``gen_length`` positions in ``steps`` steps, most confident first;
        ``step_observer(canvas, logits)`` sees every step's input and logits."""
        block_length = block_length or gen_length
        if gen_length % block_length:
            raise ValueError("gen_length must be a multiple of block_length")
        blocks = gen_length // block_length
        steps_per_block = max(1, steps // blocks)
        mask_id = int(self.config.mask_token_id)
        batch, prompt_len = input_ids.shape
        x = torch.full(
            (batch, prompt_len + gen_length), mask_id, dtype=torch.long, device=input_ids.device
        )
        x[:, :prompt_len] = input_ids
        run = forward or (lambda ids: self(input_ids=ids, use_cache=False).logits)
        done = 0
        positions = torch.arange(x.shape[1], device=x.device)
        for b in range(blocks):
            lo, hi = prompt_len + b * block_length, prompt_len + (b + 1) * block_length
            in_block = (positions >= lo) & (positions < hi)
            # Spread the block's positions over its steps (earlier steps take the remainder).
            per_step = [block_length // steps_per_block] * steps_per_block
            for i in range(block_length % steps_per_block):
                per_step[i] += 1
            for k in per_step:
                logits = run(x)
                if step_observer is not None:
                    step_observer(x, logits)
                done += 1
                if k == 0:
                    continue
                probs = torch.softmax(logits.float(), dim=-1)
                conf, pred = probs.max(dim=-1)
                masked = (x == mask_id) & in_block
                conf = torch.where(masked, conf, torch.full_like(conf, -1.0))
                top = conf.topk(k, dim=-1).indices
                x.scatter_(1, top, pred.gather(1, top))
        return TinyDiffusionOutput(sequences=x, num_denoising_steps=done)


def make_tiny_diffusion_model(path: str | Path, *, seed: int = 0, **overrides: Any) -> Path:
    """A loadable folder (needs ``trust_remote_code``) whose model implements the protocol."""
    from .models import tiny_config, write_byte_tokenizer

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(path)
    base = tiny_config("llama", **overrides).to_dict()
    for key in ("model_type", "architectures", "transformers_version", "auto_map"):
        base.pop(key, None)
    config = TinyDiffusionConfig(**base)
    config.architectures = ["TinyDiffusionLM"]
    auto_map = {
        "AutoConfig": f"{Path(CONFIG_SHIM).stem}.TinyDiffusionConfig",
        "AutoModelForCausalLM": f"{Path(MODEL_SHIM).stem}.TinyDiffusionLM",
    }
    config.auto_map = auto_map
    torch.manual_seed(seed)
    model = TinyDiffusionLM(config)
    model.save_pretrained(str(path), safe_serialization=True)
    (path / CONFIG_SHIM).write_text(_SHIM_CONFIG)
    (path / MODEL_SHIM).write_text(_SHIM_MODEL)
    cfg = json.loads((path / "config.json").read_text())
    cfg["auto_map"] = auto_map
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path.resolve()


def diffusion_gemma_available() -> str | None:
    """None when the installed transformers has DiffusionGemma; else why not (a skip reason)."""
    import transformers

    if hasattr(transformers, "DiffusionGemmaForBlockDiffusion"):
        return None
    return (
        f"transformers {transformers.__version__} has no native block-diffusion class "
        "(DiffusionGemmaForBlockDiffusion, transformers >= 5.24)"
    )


def make_tiny_diffusion_gemma(
    path: str | Path, *, seed: int = 0, canvas_length: int = 8, **text_overrides: Any
) -> Path:
    """A tiny ``DiffusionGemmaForBlockDiffusion`` folder, built by transformers' own classes.

    The native block-diffusion class (``model_type`` ``diffusion_gemma``): an encoder that
    fills a KV cache, a bidirectional decoder that denoises ``canvas_length``-token canvases,
    MoE layers and a (one-block) Gemma 4 vision tower, with the byte-level tokenizer. Its
    sliding window (64) is wider than the prompts and generations tests use. Raises
    ``RuntimeError`` where transformers has no such class (:func:`diffusion_gemma_available`).
    """
    reason = diffusion_gemma_available()
    if reason is not None:
        raise RuntimeError(reason)
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    from .models import write_byte_tokenizer

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_byte_tokenizer(path)
    text: dict[str, Any] = {
        "vocab_size": vocab + 5,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "global_head_dim": 32,
        "sliding_window": 64,
        "max_position_embeddings": 512,
        "layer_types": ["sliding_attention", "full_attention"],
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 32,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        **text_overrides,
    }
    vision = {
        "model_type": "gemma4_vision",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
    }
    config = DiffusionGemmaConfig(
        text_config=text,
        vision_config=vision,
        canvas_length=canvas_length,
        boi_token_id=vocab + 1,
        eoi_token_id=vocab + 2,
        image_token_id=vocab + 3,
    )
    torch.manual_seed(seed)
    DiffusionGemmaForBlockDiffusion(config).save_pretrained(str(path))
    return path.resolve()
