"""The prefill regime: one forward over the prompt (with ``--image`` the whole
vision-language model on the image prompt), timed per forward.

Eager: the forward; hf-compile: the forward compiled as ``generate`` compiles it, timed by
the eager loop; graph arms: the forward captured once and replayed (``pypto_capture.
capture_and_replay``), with the decode runner's capture mitigations where the capture
needs them (NPU graphs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..config import Arm, BenchConfig, Regime
from ..measure import summarize, summarize_seconds
from ..report import ArmResult
from .base import Context, Memory, RegimeProtocol, mitigation_details, tick, timed
from .peer import compiled_prefill_fn, recipe_scope

__all__ = [
    "PrefillRegime",
    "fill_prefill",
    "prefill_fn",
    "prefill_mitigations",
    "prefill_tokens",
    "run_eager_prefill",
    "run_graph_prefill",
    "run_prefill",
]


def prefill_tokens(logits: Any) -> Any:
    """The argmax tokens of a prefill's logits; :class:`NonFiniteLogitsError` when they
    hold NaN or +inf (their argmax is no answer: non-finite logits fail an arm, always)."""
    from ..errors import NonFiniteLogitsError

    if bool(logits.isnan().any() | logits.isposinf().any()):  # one host sync
        raise NonFiniteLogitsError(
            "the logits hold NaN or +inf (non-finite logits fail an arm, always: their argmax "
            "is no answer); check the config's numbers (e.g. rms_norm_eps) and the dtype "
            "(float16 overflows where bfloat16 does not)"
        )
    return logits.argmax(-1)


def prefill_fn(ctx: Context) -> Callable[[], Any]:
    """One forward over the prompt; with --image the whole VL model on the image prompt."""
    model, ids, mask, extra = ctx.model, ctx.input_ids, ctx.attention_mask, ctx.model_inputs

    def fn() -> Any:
        return model(input_ids=ids, attention_mask=mask, use_cache=False, **extra).logits

    return fn


def run_eager_prefill(
    ctx: Context, arm: ArmResult, mem: Memory, fn: Callable[[], Any] | None = None
) -> Any:
    """Warmup and timed forwards of ``fn`` (default: the eager forward); the argmax tokens."""
    import torch

    cfg = ctx.config
    fn = fn or prefill_fn(ctx)
    times = []
    out: Any = None
    with torch.inference_mode():
        for i in range(cfg.warmup):
            fn()
            tick(ctx, arm.name, i + 1)
        for i in range(cfg.iters):
            out, seconds = timed(ctx.device, fn)
            times.append(seconds)
            mem.sample()
            tick(ctx, arm.name, cfg.warmup + i + 1)
    fill_prefill(ctx, arm, times)
    return prefill_tokens(out)


@contextlib.contextmanager
def prefill_mitigations(
    ctx: Context, arm: ArmResult, backend: str, *, mitigate: bool | None = None
) -> Iterator[Any]:
    """The capture mitigations the decode runner applies, for a captured prefill.

    The same rule decides (``pypto_capture.needs_capture_mitigations``: NPU graphs) and the
    same patches apply (eager attention, rotary tables, mask functions); a prefill has no
    capture-safe cache to build its masks, so one eager forward of the arm's inputs records
    them and the capture replays them prebuilt. ``mitigate`` overrides the rule (tests run
    the NPU path's patches on the CPU). Undone when the block ends.
    """
    import torch

    from pypto_capture import apply_capture_mitigations, needs_capture_mitigations

    device_type = getattr(ctx.device, "type", str(ctx.device))
    wanted = needs_capture_mitigations(backend, device_type) if mitigate is None else mitigate
    if not wanted:
        arm.details["mitigations"] = mitigation_details(None, backend, device_type)
        yield None
        return
    handle = apply_capture_mitigations(
        ctx.model, attn="switch", max_positions=int(ctx.input_ids.shape[1])
    )
    try:
        with torch.inference_mode(), handle.recording_masks():
            prefill_fn(ctx)()
        arm.details["mitigations"] = mitigation_details(handle, backend, device_type)
        yield handle
    finally:
        handle.undo()


def run_graph_prefill(
    ctx: Context,
    arm: ArmResult,
    mem: Memory,
    *,
    mitigate: bool | None = None,
    after: Callable[[ArmResult, Any], None] | None = None,
) -> Any:
    """The graph arms: the forward captured, ``warmup`` then ``iters`` timed replays."""
    import torch

    from pypto_capture import capture_and_replay, make_backend

    cfg = ctx.config
    backend = make_backend(cfg.graph_backend, ctx.device)
    with (
        prefill_mitigations(ctx, arm, backend.name, mitigate=mitigate),
        torch.inference_mode(),
    ):
        result = capture_and_replay(
            prefill_fn(ctx),
            warmup=cfg.warmup,
            replays=cfg.iters,
            backend=backend,
            device=ctx.device,
        )
    tick(ctx, arm.name, cfg.warmup + cfg.iters)
    mem.sample()
    times = list(result.times_s)
    arm.details["backend"] = getattr(result, "backend", cfg.graph_backend)
    arm.details["capture_s"] = getattr(result, "capture_s", None)
    fill_prefill(ctx, arm, times)
    if after is not None:  # the last replay's logits (pypto_bench.numerics)
        after(arm, lambda: result.output)
    return prefill_tokens(result.output)


def fill_prefill(ctx: Context, arm: ArmResult, times: list[float]) -> None:
    """The arm's figures from its forward times."""
    # Prompt tokens per forward: batch x seq for text; an image prompt is longer (its
    # template and image placeholders come on top of the --seq text tokens).
    n = int(ctx.input_ids.numel())
    arm.tokens_per_s = summarize([n / t for t in times])
    arm.seconds = summarize_seconds(times)
    arm.tokens_per_iter = [n] * len(times)


def _captured_forward(
    ctx: Context, arm: ArmResult, stack: contextlib.ExitStack
) -> Callable[[], Any]:
    """The graph arms' forward captured once (one replay per call, one named step each)."""
    import torch

    from pypto_capture import STEP_MARKER, make_backend

    backend = make_backend(ctx.config.graph_backend, ctx.device)
    arm.details["backend"] = backend.name
    # Kept on while the caller replays (closed with the arm).
    stack.enter_context(prefill_mitigations(ctx, arm, backend.name))
    with torch.inference_mode():
        replay = backend.capture(prefill_fn(ctx), warmup=1).replay

    def fn() -> Any:
        # One forward = one step, as the eager arm's forward is (pypto-tune).
        if torch.autograd._profiler_enabled():
            with torch.profiler.record_function(STEP_MARKER):
                return replay()
        return replay()

    return fn


@contextlib.contextmanager
def _arm_iteration(ctx: Context, arm: ArmResult) -> Iterator[Callable[[], Any]]:
    """The arm dispatch of this regime's single iteration, written once."""
    if arm.name == Arm.EAGER:
        yield prefill_fn(ctx)
    elif arm.name == Arm.HF_COMPILE:
        with recipe_scope(ctx):
            yield compiled_prefill_fn(ctx, arm)
    else:
        with contextlib.ExitStack() as stack:
            yield _captured_forward(ctx, arm, stack)


def run_prefill(
    ctx: Context,
    arm: ArmResult,
    mem: Memory,
    *,
    mitigate: bool | None = None,
    after: Callable[[ArmResult, Any], None] | None = None,
) -> Any:
    """Warmup and timed forwards of ``arm.name`` in the prefill regime; the argmax tokens.

    The graph arms time their replays through ``capture_and_replay``; eager and hf-compile
    through the eager loop (hf-compile's first call, which compiles, is ``capture_s``).
    ``after(arm, forward)`` runs once the timed forwards are done, the arm still built
    (the numerical gate reads its logits).
    """
    import torch

    if arm.name not in (Arm.EAGER, Arm.HF_COMPILE):
        return run_graph_prefill(ctx, arm, mem, mitigate=mitigate, after=after)
    with _arm_iteration(ctx, arm) as fn:
        if arm.name == Arm.HF_COMPILE:
            with torch.inference_mode():
                _, arm.details["capture_s"] = timed(ctx.device, fn)
            mem.end_phase("capture")
        tokens = run_eager_prefill(ctx, arm, mem, fn)
        if after is not None:
            after(arm, fn)
        return tokens


class PrefillRegime(RegimeProtocol):
    """``--regime prefill`` (see the module)."""

    regime = Regime.PREFILL.value

    def run(
        self,
        ctx: Context,
        arm: ArmResult,
        mem: Memory,
        after: Callable[[ArmResult, Any], None] | None = None,
    ) -> Any:
        return run_prefill(ctx, arm, mem, after=after)

    def iteration(
        self, ctx: Context, arm: ArmResult
    ) -> contextlib.AbstractContextManager[Callable[[], Any]]:
        """One forward (captured for the graph arms, compiled for hf-compile)."""
        return _arm_iteration(ctx, arm)

    def reference(self, ctx: Context) -> Any:
        import torch

        with torch.inference_mode():
            return prefill_fn(ctx)().argmax(-1)

    def produced(self, ctx: Context, tokens: Any) -> list[int]:
        # Prefill compares every position's argmax.
        return [tokens.shape[1]] * tokens.shape[0]

    def moe_token_counts(self, config: BenchConfig) -> tuple[int, ...]:
        return (config.batch * config.seq,)
