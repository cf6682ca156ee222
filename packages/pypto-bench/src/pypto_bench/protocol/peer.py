"""The hf-compile (peer) arm's side of the protocol: transformers' recipe, fed to the
eager arm's timed code (decode: ``generate`` with the recipe's keywords; prefill: the
forward compiled as ``generate`` compiles it). The recipe itself is :mod:`pypto_bench.peer`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..report import ArmResult
from .base import Context

__all__ = ["compiled_prefill_fn", "peer_config", "peer_generate_kwargs", "recipe_scope"]


def peer_config(ctx: Context, arm: ArmResult) -> Any:
    """transformers' ``CompileConfig`` for the run's device; the arm's details name it."""
    from ..peer import compile_config

    config, described = compile_config(ctx.device, ctx.config.compile_mode)
    arm.details["backend"] = f"transformers CompileConfig ({described.get('backend')})"
    arm.details["peer"] = described
    return config


def peer_generate_kwargs(ctx: Context, arm: ArmResult) -> dict[str, Any]:
    """The ``generate`` keywords that turn the eager decode into the peer recipe."""
    from ..peer import generate_kwargs

    return generate_kwargs(peer_config(ctx, arm))


def compiled_prefill_fn(ctx: Context, arm: ArmResult) -> Callable[[], Any]:
    """One forward over the prompt through the recipe's compiled call."""
    from ..peer import compiled_prefill

    call = compiled_prefill(ctx.model, peer_config(ctx, arm))
    ids, mask, extra = ctx.input_ids, ctx.attention_mask, ctx.model_inputs

    def fn() -> Any:
        return call(input_ids=ids, attention_mask=mask, use_cache=False, **extra).logits

    return fn


@contextlib.contextmanager
def recipe_scope(ctx: Context) -> Iterator[None]:
    """Whatever the recipe left on the model is dropped when the arm ends."""
    from ..peer import forget_compiled_call

    try:
        yield
    finally:
        forget_compiled_call(ctx.model)
