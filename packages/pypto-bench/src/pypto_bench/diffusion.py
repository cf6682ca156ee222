"""The diffusion-generate protocol and a minimal model that implements it.

Protocol (contract D; the README documents it for model packages). A model class
supports the ``diffusion-generate`` regime when it has::

    def diffusion_generate(self, input_ids, *, gen_length, steps, block_length=None,
                           forward=None, **kwargs) -> DiffusionOutput-like

returning an object or dict with ``sequences`` (LongTensor [B, prompt + gen_length]) and
``num_denoising_steps`` (int). ``forward`` is optional for the model to honour: when
given, it is a callable ``forward(input_ids [B, L]) -> logits [B, L, V]`` that the
model must use instead of ``self(...)`` for every denoising step. The bench's graph
arm passes a compiled/captured forward there; a model that ignores it still runs, the
graph arm then reports ``forward_used: false``.

The bench counts B * gen_length generated positions per call and divides by the whole
call's time (denoising), never subtracting the prompt twice.

``TinyDiffusionLM`` below is a masked-diffusion sampler (LLaDA-style low-confidence
remasking, without the bidirectional training) over a tiny Llama body: enough to run the
regime for real in tests. ``make_tiny_diffusion_model`` writes a loadable folder whose
code is two shim files importing this module, which is how model packages ship code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def supports_diffusion(model: Any) -> bool:
    return callable(getattr(model, "diffusion_generate", None))


def unsupported_message(model: Any) -> str:
    return (
        f"regime diffusion-generate is not supported by this model ({type(model).__name__}): "
        "it has no diffusion_generate()"
    )


@dataclass
class DiffusionOutput:
    sequences: torch.LongTensor
    num_denoising_steps: int


def read_diffusion_output(out: Any) -> tuple[torch.Tensor, int | None]:
    """(sequences, num_denoising_steps) from an object or a dict."""
    if isinstance(out, dict):
        return out["sequences"], out.get("num_denoising_steps")
    return out.sequences, getattr(out, "num_denoising_steps", None)


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
        input_ids: torch.LongTensor,
        *,
        gen_length: int,
        steps: int,
        block_length: int | None = None,
        forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
        **_: Any,
    ) -> DiffusionOutput:
        """Unmask ``gen_length`` positions in ``steps`` steps, most confident first."""
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
                done += 1
                if k == 0:
                    continue
                probs = torch.softmax(logits.float(), dim=-1)
                conf, pred = probs.max(dim=-1)
                masked = (x == mask_id) & in_block
                conf = torch.where(masked, conf, torch.full_like(conf, -1.0))
                top = conf.topk(k, dim=-1).indices
                x.scatter_(1, top, pred.gather(1, top))
        return DiffusionOutput(sequences=x, num_denoising_steps=done)


_SHIM_CONFIG = "from pypto_bench.diffusion import TinyDiffusionConfig  # noqa: F401\n"
_SHIM_MODEL = "from pypto_bench.diffusion import TinyDiffusionLM  # noqa: F401\n"


def make_tiny_diffusion_model(path: str | Path, *, seed: int = 0, **overrides: Any) -> Path:
    """A loadable folder (needs ``trust_remote_code``) whose model implements the protocol."""
    from pypto_testing.models import tiny_config, write_byte_tokenizer

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(path)
    base = tiny_config("llama", **overrides).to_dict()
    for key in ("model_type", "architectures", "transformers_version", "auto_map"):
        base.pop(key, None)
    config = TinyDiffusionConfig(**base)
    config.architectures = ["TinyDiffusionLM"]
    config.auto_map = {
        "AutoConfig": "configuration_tiny_diffusion.TinyDiffusionConfig",
        "AutoModelForCausalLM": "modeling_tiny_diffusion.TinyDiffusionLM",
    }
    torch.manual_seed(seed)
    model = TinyDiffusionLM(config)
    model.save_pretrained(str(path), safe_serialization=True)
    (path / "configuration_tiny_diffusion.py").write_text(_SHIM_CONFIG)
    (path / "modeling_tiny_diffusion.py").write_text(_SHIM_MODEL)
    cfg = json.loads((path / "config.json").read_text())
    cfg["auto_map"] = config.auto_map
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path.resolve()
