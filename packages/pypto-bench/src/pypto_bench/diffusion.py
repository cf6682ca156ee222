"""The diffusion-generate regime's model side: the protocol (contract D) and native classes.

Two kinds of model run in the regime, and the report says which path ran:

* **protocol** models have::

      def diffusion_generate(self, input_ids, *, gen_length, steps, block_length=None,
                             forward=None, **kwargs) -> DiffusionOutput-like

  returning an object or dict with ``sequences`` (LongTensor [B, prompt + gen_length])
  and ``num_denoising_steps`` (int: forward passes whose predictions were used, the NFE).
  ``steps`` is the whole generation's budget. Optional answer fields, read when present:
  ``num_forward_passes`` (all forwards, cache fills included), ``steps_per_block``,
  ``path`` (which implementation ran), ``logits_finite``, ``capture_s``.
  Optional keywords, passed only when the method names them: ``step_backend`` (a
  pypto-capture graph backend: the model captures its own fixed-shape step, e.g. one
  block against a KV cache) and ``ignore_eos`` (generate every position). Without
  ``step_backend`` the graph arm passes ``forward``: a callable ``forward(input_ids [B, L])
  -> logits [B, L, V]`` (a captured whole-sequence forward) the model uses for every
  denoising step; a model that ignores it still runs (``forward_used: false``).
  pypto-models-llada2's ``LLaDA2MoeModelLM`` and pypto-testing's tiny diffusion model
  implement it.
* **native** models are transformers' own block-diffusion classes (5.24:
  ``DiffusionGemmaForBlockDiffusion``): their ``generate()`` is the diffusion loop, driven
  here through that API (``max_new_tokens``, ``max_denoising_steps`` per canvas); the graph
  arm asks it for its static-cache path, where the model compiles its own encoder and
  denoising steps (``torch.compile``, CUDA graphs on a GPU).

Counting is honest and the same for both: per row, the generated positions up to and
including the first EOS (all of them with ``ignore_eos``), without mask or pad tokens the
model left unfilled; the prompt is never counted (the seed harness subtracted it twice).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


def _explicit_params(fn: Any) -> set[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD}


def native_block_diffusion(model: Any) -> bool:
    """True for transformers' own block-diffusion classes (``generate`` is a diffusion loop)."""
    for cls in type(model).__mro__:
        name = cls.__name__
        if name.endswith("ForBlockDiffusion") or name.endswith("DiffusionGenerationMixin"):
            return callable(getattr(model, "generate", None))
    return False


def supports_protocol(model: Any) -> bool:
    return callable(getattr(model, "diffusion_generate", None))


def supports_diffusion(model: Any) -> bool:
    return supports_protocol(model) or native_block_diffusion(model)


def captures_own_step(model: Any) -> bool:
    """The model's ``diffusion_generate`` takes ``step_backend`` (it captures its own step)."""
    return supports_protocol(model) and "step_backend" in _explicit_params(model.diffusion_generate)


def unsupported_message(model: Any) -> str:
    return (
        f"regime diffusion-generate is not supported by this model ({type(model).__name__}): "
        "it has no diffusion_generate() and is not a transformers block-diffusion class; "
        "pick --regime decode or prefill"
    )


@dataclass
class DiffusionOutput:
    """One generation's answer, normalised (see the module docstring for the fields)."""

    sequences: torch.Tensor
    num_denoising_steps: int | None
    num_forward_passes: int | None = None
    steps_per_block: list[int] | None = None
    path: str | None = None
    logits_finite: bool | None = None
    capture_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_OPTIONAL = ("num_forward_passes", "steps_per_block", "path", "logits_finite", "capture_s")


def read_diffusion_output(out: Any) -> tuple[torch.Tensor, int | None]:
    """(sequences, num_denoising_steps) from an object or a dict."""
    full = normalise_output(out)
    return full.sequences, full.num_denoising_steps


def normalise_output(out: Any) -> DiffusionOutput:
    """A :class:`DiffusionOutput` from a protocol answer (object or dict)."""

    def get(name: str) -> Any:
        return out.get(name) if isinstance(out, dict) else getattr(out, name, None)

    sequences = out["sequences"] if isinstance(out, dict) else out.sequences
    optional = {name: get(name) for name in _OPTIONAL}
    steps = optional["steps_per_block"]
    return DiffusionOutput(
        sequences=sequences,
        num_denoising_steps=get("num_denoising_steps"),
        num_forward_passes=optional["num_forward_passes"],
        steps_per_block=list(steps) if steps is not None else None,
        path=optional["path"],
        logits_finite=optional["logits_finite"],
        capture_s=optional["capture_s"],
    )


def diffusion_generate(
    model: Any,
    input_ids: torch.Tensor,
    *,
    gen_length: int,
    steps: int,
    block_length: int | None = None,
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
    step_backend: Any = None,
    ignore_eos: bool = False,
    native_static: bool = False,
) -> DiffusionOutput:
    """Run one generation on a protocol or native model; the answer normalised.

    Why a function: callers (the bench, the smoke gate, pypto-e2e, a model package's own
    tests) read one type whatever the model returns, and optional keywords are only passed
    to models that name them, so models that predate them keep working.
    ``native_static`` asks a native model for its static-cache (compiled) path.
    """
    if supports_protocol(model):
        kwargs: dict[str, Any] = {
            "gen_length": gen_length,
            "steps": steps,
            "block_length": block_length,
        }
        named = _explicit_params(model.diffusion_generate)
        if forward is not None:
            kwargs["forward"] = forward
        if step_backend is not None:
            if "step_backend" not in named:
                raise TypeError(f"{type(model).__name__}.diffusion_generate takes no step_backend")
            kwargs["step_backend"] = step_backend
        if ignore_eos and "ignore_eos" in named:
            kwargs["ignore_eos"] = True
        return normalise_output(model.diffusion_generate(input_ids, **kwargs))
    if native_block_diffusion(model):
        return _native_generate(
            model,
            input_ids,
            gen_length=gen_length,
            steps=steps,
            block_length=block_length,
            static=native_static,
        )
    raise TypeError(unsupported_message(model))


def _native_generate(
    model: Any,
    input_ids: torch.Tensor,
    *,
    gen_length: int,
    steps: int,
    block_length: int | None,
    static: bool,
) -> DiffusionOutput:
    """transformers' own block-diffusion ``generate`` (DiffusionGemma's API)."""
    from .errors import BadInputError

    canvas = getattr(model.config, "canvas_length", None)
    name = type(model).__name__
    if canvas is None:
        raise BadInputError(f"{name} has no config.canvas_length: cannot size its denoising steps")
    if block_length is not None and int(block_length) != int(canvas):
        raise BadInputError(
            f"{name} generates canvases of {canvas} tokens (config.canvas_length): "
            f"drop --block-length or pass --block-length {canvas}"
        )
    canvases = math.ceil(gen_length / canvas)
    per_canvas = max(1, int(steps) // canvases)
    kwargs: dict[str, Any] = {
        "max_new_tokens": gen_length,
        "max_denoising_steps": per_canvas,
        "return_dict_in_generate": True,
    }
    if static:
        kwargs["cache_implementation"] = "static"
    out = model.generate(input_ids, **kwargs)
    sequences = out.sequences
    nfe = _native_forwards(
        out, sequences, input_ids.shape[1], getattr(model.generation_config, "pad_token_id", None)
    )
    how = (
        "static cache; the model compiles its own encoder and denoising steps"
        if static
        else "dynamic cache, eager"
    )
    return DiffusionOutput(
        sequences=sequences,
        num_denoising_steps=nfe,
        path=f"native {name}.generate ({how})",
        extra={"max_denoising_steps_per_canvas": per_canvas, "canvas_length": int(canvas)},
    )


def _native_forwards(
    out: Any, sequences: torch.Tensor, prompt_len: int, pad_id: int | None
) -> int | None:
    """Denoising forwards of a native generate: rows' valid tokens / their tokens per forward.

    DiffusionGemma reports only ``tokens_per_forward`` per row (valid tokens / forwards
    that row needed); the batch runs as many forwards as its slowest row.
    """
    tpf = getattr(out, "tokens_per_forward", None)
    if tpf is None:
        return None
    new = sequences[:, prompt_len:]
    valid = (
        (new != pad_id).sum(dim=-1)
        if pad_id is not None
        else torch.full((new.shape[0],), new.shape[1])
    )
    passes = []
    for v, t in zip(valid.tolist(), torch.as_tensor(tpf).reshape(-1).tolist(), strict=False):
        if t and math.isfinite(t) and t > 0:
            passes.append(round(v / t))
    return max(passes) if passes else None


def count_generated(
    sequences: torch.Tensor,
    prompt_len: int,
    eos_ids: Sequence[int],
    *,
    unfilled_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    gen_length: int | None = None,
) -> list[int]:
    """Generated tokens per row: after the prompt, up to and including the first EOS.

    With ``ignore_eos`` every generated position counts (up to ``gen_length``). Positions
    still holding an ``unfilled_ids`` token (a mask id, a pad id) before the cut are not
    output and are not counted.
    """
    gen = sequences[:, prompt_len:]
    if ignore_eos and gen_length is not None:
        gen = gen[:, :gen_length]
    from .measure import count_tokens

    eos = {int(e) for e in eos_ids}
    unfilled = {int(u) for u in unfilled_ids}
    rows = gen.tolist()
    # The cut at the first EOS is the decode regime's own rule (one definition).
    cuts = count_tokens(rows, eos_ids, ignore_eos=ignore_eos)
    return [
        sum(1 for tok in row[:n] if tok not in unfilled or tok in eos)
        for row, n in zip(rows, cuts, strict=True)
    ]
