"""The numerical gate of the diffusion-generate regime: the denoiser's logits, step by step.

A diffusion generation is a loop of denoising steps, each one forward of the denoiser over
a canvas. The eager arm's generation is run once, untimed, with every step's input ids and
logits recorded (``step_observer``: pypto_bench.diffusion.observes_steps says which models
allow it); each graph arm then runs its own generation (its plan, the same seed) and each of
its steps is held to eager's step of the same index **while the two steps were fed the same
canvas**: the first step whose canvas differs ends the comparison (its logits answer another
question), and the report says how many steps were compared of how many. Every compared
step's logits at every position are judged by the gate's rule (pypto_bench.numerics.
judge_arm): a 1% error in one layer fails, a flipped sample draw does not by itself.

The graph arms' same-seed token match is still reported beside it, as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from .config import Regime
from .protocol import Context

__all__ = [
    "MAX_REFERENCE_BYTES",
    "DenoiserReference",
    "NotCompared",
    "denoiser_logits",
    "denoiser_reference",
]

log = logging.getLogger(__name__)

#: The eager steps' logits kept for the comparison, at most (float32 on the host): a long
#: generation of a large-vocabulary model keeps its first steps only, and says so.
MAX_REFERENCE_BYTES = 1 << 30


@dataclass
class _Steps:
    """(input ids, logits) of denoising steps, copied to the host, bounded by bytes."""

    limit: int = MAX_REFERENCE_BYTES
    ids: list[Any] = field(default_factory=list)
    logits: list[Any] = field(default_factory=list)
    seen: int = 0
    bytes: int = 0

    def __call__(self, ids: Any, logits: Any) -> None:
        self.seen += 1
        size = logits.numel() * 4
        if self.bytes + size > self.limit:
            return
        self.bytes += size
        self.ids.append(ids.detach().to("cpu", copy=True))
        self.logits.append(logits.detach().to("cpu").float())


@dataclass(frozen=True)
class DenoiserReference:
    """The eager generation's denoising steps (what every arm is held to)."""

    dtype: str
    ids: list[Any]
    logits: list[Any]
    steps: int  # the eager generation's steps (``len(ids)`` fewer when bounded)
    why_not: str | None = None  # set: the model's steps cannot be observed (arms not checked)
    step_seconds: tuple[float, ...] = ()  # no per-step latency from a diffusion generation

    @property
    def regime(self) -> str:
        return Regime.DIFFUSION.value


def denoiser_reference(ctx: Context) -> DenoiserReference:
    """The eager generation, its steps recorded (``why_not`` when the model hides them)."""
    import torch

    from .diffusion import captures_own_step, observes_steps
    from .protocol.diffusion import diffusion_call

    dtype = str(next(ctx.model.parameters()).dtype).replace("torch.", "")
    if not observes_steps(ctx.model):
        name = type(ctx.model).__name__
        why = (
            f"{name}.diffusion_generate takes no step_observer: its denoiser's logits cannot "
            "be compared (the same-seed tokens are)"
        )
        return DenoiserReference(dtype, [], [], 0, why)
    steps = _Steps()
    with torch.inference_mode():
        diffusion_call(ctx, {"step_observer": steps})
    if not steps.ids:
        return DenoiserReference(dtype, [], [], steps.seen, "the eager generation ran no step")
    if captures_own_step(ctx.model):
        log.debug("the model captures its own step: its arms are observed the same way")
    return DenoiserReference(dtype, steps.ids, steps.logits, steps.seen)


class NotCompared(Exception):
    """The arm's steps could not be held to eager's (the message says why)."""


def denoiser_logits(
    ctx: Context, run: Any, ref: DenoiserReference
) -> tuple[Any, Any, str, dict[str, int]]:
    """Run the arm's generation once more (``run``: its built plan, the same seed) and return
    (its logits, eager's, the basis in words, ``{"compared", "eager"}`` step counts) over the
    steps both were fed the same canvas. Raises :class:`NotCompared` with the reason."""
    import torch

    from .protocol.diffusion import diffusion_call

    if ref.why_not:
        raise NotCompared(ref.why_not)
    plan = dict(getattr(run, "plan", None) or {})
    steps = _Steps()
    with torch.inference_mode():
        diffusion_call(ctx, {**plan, "step_observer": steps})
    n = 0
    for mine, theirs in zip(steps.ids, ref.ids, strict=False):
        if mine.shape != theirs.shape or not torch.equal(mine, theirs):
            break
        n += 1
    if n == 0:
        raise NotCompared(
            "its first denoising step was fed another canvas than eager's"
            if steps.ids
            else "its generation exposed no denoising step"
        )
    mine_logits = torch.cat(steps.logits[:n], dim=1)
    eager_logits = torch.cat(ref.logits[:n], dim=1)
    if mine_logits.shape != eager_logits.shape:
        raise NotCompared(
            f"logits of shape {tuple(mine_logits.shape)} against eager's "
            f"{tuple(eager_logits.shape)}"
        )
    total = ref.steps
    stopped = "" if n == total else f"; step {n + 1} was fed another canvas (or was not kept)"
    basis = (
        f"{n} of {total} denoising steps fed the same canvas as eager's, every position of "
        f"each ({int(mine_logits.shape[1])} logit rows){stopped}"
    )
    return mine_logits, eager_logits, basis, {"compared": n, "eager": total}
