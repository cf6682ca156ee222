"""How one arm of one regime is measured: the (regime x arm) dispatch, written once.

* :mod:`.base`: the contract (:class:`RegimeProtocol`), the arm context
  (:class:`Context`), memory peaks (:class:`Memory`), the timed span (:func:`timed`),
  the prompt rule (:func:`make_context`), kernel plug-ins and MoE routing per arm;
* :mod:`.decode`, :mod:`.prefill`, :mod:`.diffusion`: one module per regime, each
  dispatching on the arm inside (eager, graph, pypto+graph, hf-compile);
* :mod:`.peer`: the hf-compile arm's side (transformers' recipe fed to the eager loop);
* here: the factory :func:`regime_for` and the three consumers' entry points:
  :func:`measure_arm` (a timed arm: the single run, each ``--nproc`` rank),
  :func:`arm_iteration` (one iteration, built: ``BenchSession``, pypto-tune) and
  :func:`reference_tokens` (the eager reference when eager was not requested).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from ..config import ARMS, PEER_ARM, PEER_REGIMES, REGIMES, BenchConfig, Regime
from ..errors import BadInputError
from ..report import ArmResult
from .base import (
    STATIC_MOE_NOTE,
    Context,
    Memory,
    ProgressFn,
    RegimeProtocol,
    apply_moe_routing,
    kernels_for,
    make_context,
    make_prompt_ids,
    timed,
)
from .decode import DecodeRegime
from .diffusion import DiffusionRegime
from .prefill import PrefillRegime

__all__ = [
    "STATIC_MOE_NOTE",
    "Context",
    "DecodeRegime",
    "DiffusionRegime",
    "Memory",
    "PrefillRegime",
    "ProgressFn",
    "RegimeProtocol",
    "arm_iteration",
    "kernels_for",
    "make_context",
    "make_prompt_ids",
    "measure_arm",
    "moe_routing_for",
    "reference_tokens",
    "regime_for",
    "timed",
]

log = logging.getLogger(__name__)

_REGIMES: dict[str, RegimeProtocol] = {
    Regime.DECODE: DecodeRegime(),
    Regime.PREFILL: PrefillRegime(),
    Regime.DIFFUSION: DiffusionRegime(),
}


def regime_for(config: BenchConfig | str) -> RegimeProtocol:
    """The protocol of ``config.regime`` (or of a regime name)."""
    name = config if isinstance(config, str) else config.regime
    try:
        return _REGIMES[name]
    except KeyError:
        raise BadInputError(
            f"unknown regime {name!r}: choose one of {', '.join(REGIMES)}"
        ) from None


@contextlib.contextmanager
def moe_routing_for(ctx: Context, arm: ArmResult) -> Iterator[Any]:
    """The graph arms' MoE experts for this regime's captures (see ``base.apply_moe_routing``)."""
    counts = regime_for(ctx.config).moe_token_counts(ctx.config)
    with apply_moe_routing(ctx, arm, counts) as handle:
        yield handle


def measure_arm(ctx: Context, arm: ArmResult, **run_options: Any) -> Any:
    """Warmup and timed iterations of ``arm`` (MoE routing and kernel plug-ins on), its
    memory in ``arm.memory``; returns the tokens for the agreement check. ``run_options``
    go to the regime's ``run`` (decode: ``keep``)."""
    regime = regime_for(ctx.config)
    mem = Memory(ctx.device)
    try:
        with moe_routing_for(ctx, arm), kernels_for(ctx, arm.name) as plugins:
            if plugins:
                arm.details["plugins"] = [p.name for p in plugins]
            tokens = regime.run(ctx, arm, mem, **run_options)
            if plugins:
                arm.details["plugin_reports"] = {p.name: p.report() for p in plugins}
    finally:
        arm.memory = mem.result()
    if arm.memory["reserved_growth"] > 0:
        msg = (
            f"{arm.name}: reserved memory grew by {arm.memory['reserved_growth']} bytes across "
            "iterations (dynamic-shape workspace growth?)"
        )
        log.warning(msg)
        arm.warnings.append(msg)
    return tokens


@contextlib.contextmanager
def arm_iteration(ctx: Context, arm: ArmResult) -> Iterator[Callable[[], Any]]:
    """Yield a no-argument callable running one measured iteration of ``arm.name`` (in
    inference mode), built as the timed arm builds it: MoE routing and kernel plug-ins on,
    capture or compile done before the yield. ``arm.details`` fills as it runs."""
    import torch

    if arm.name not in ARMS:
        raise BadInputError(f"unknown arm {arm.name!r}: choose from {', '.join(ARMS)}")
    regime = regime_for(ctx.config)
    if arm.name == PEER_ARM and regime.regime not in PEER_REGIMES:
        raise BadInputError(
            f"the {PEER_ARM} arm runs in the {' and '.join(PEER_REGIMES)} regimes only"
        )
    with moe_routing_for(ctx, arm), kernels_for(ctx, arm.name) as plugins:
        if plugins:
            arm.details["plugins"] = [p.name for p in plugins]
        with regime.iteration(ctx, arm) as fn:

            def run() -> Any:
                with torch.inference_mode():
                    return fn()

            run.__wrapped__ = fn  # type: ignore[attr-defined]  # the regime's own runner
            yield run
        if plugins:
            arm.details["plugin_reports"] = {p.name: p.report() for p in plugins}


def reference_tokens(ctx: Context) -> Any:
    """Eager tokens for the agreement check when the eager arm was not requested."""
    return regime_for(ctx.config).reference(ctx)
