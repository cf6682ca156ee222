"""The diffusion-generate protocol (contract D; the README documents it for model packages).

A model class supports the ``diffusion-generate`` regime when it has::

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

A tiny model implementing the protocol, for tests, is
``pypto_testing.diffusion.make_tiny_diffusion_model`` (test helpers live in
pypto-testing, not in this library).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def supports_diffusion(model: Any) -> bool:
    return callable(getattr(model, "diffusion_generate", None))


def unsupported_message(model: Any) -> str:
    return (
        f"regime diffusion-generate is not supported by this model ({type(model).__name__}): "
        "it has no diffusion_generate(); pick --regime decode or prefill"
    )


@dataclass
class DiffusionOutput:
    sequences: torch.Tensor
    num_denoising_steps: int | None


def read_diffusion_output(out: Any) -> tuple[torch.Tensor, int | None]:
    """(sequences, num_denoising_steps) from an object or a dict."""
    if isinstance(out, dict):
        return out["sequences"], out.get("num_denoising_steps")
    return out.sequences, getattr(out, "num_denoising_steps", None)


def diffusion_generate(
    model: Any,
    input_ids: torch.Tensor,
    *,
    gen_length: int,
    steps: int,
    block_length: int | None = None,
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> DiffusionOutput:
    """Call a model's ``diffusion_generate`` per the protocol; the answer normalised.

    Why a function: callers (the bench, pypto-e2e, a model package's own tests) then
    read one type whether the model returns a dict or an object, and ``forward`` is
    only passed when given, so models that predate it keep working.
    """
    kwargs: dict[str, Any] = {
        "gen_length": gen_length,
        "steps": steps,
        "block_length": block_length,
    }
    if forward is not None:
        kwargs["forward"] = forward
    sequences, steps_done = read_diffusion_output(model.diffusion_generate(input_ids, **kwargs))
    return DiffusionOutput(sequences=sequences, num_denoising_steps=steps_done)
