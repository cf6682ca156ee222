"""The numerical gate: a fast arm that computes something else is not a speedup.

Every non-eager arm of a decode or prefill run is held to the eager arm's logits on the
same inputs, judged by pypto-precision's rule (:func:`pypto_precision.judge_logits`):

* **decode, graph arms** (graph, pypto+graph): the captured step is replayed on the eager
  reference's own tokens (teacher forcing, ``DecodeStepRunner.forced_logits``), so one
  flipped token does not fail every later step and a 1% error in one layer that leaves
  every argmax unchanged still shows in the KL;
* **decode, hf-compile**: transformers' ``generate`` takes no forced tokens, so its logits
  are compared step by step up to and including the first step whose token differs (each
  of those steps was fed the same tokens as the reference): the report says how many;
* **prefill**: every position's logits of the arm's forward against eager's.

The reference is one untimed eager pass on the model as loaded, before any arm runs (its
tokens are the eager arm's). An arm fails when its logits are non-finite or its KL max
exceeds the dtype's allowance; the report carries the numbers it was judged against.
Arms whose outputs differ by design (the static MoE proxy) are exempt and say so; the
diffusion regime is not checked here yet and says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import Arm, Regime
from .protocol import Context
from .report import ArmResult

__all__ = [
    "GATE_KL_MAX",
    "NUMERICS_BASIS",
    "Reference",
    "after_hook",
    "arm_numerics",
    "eager_reference",
    "numerics_failed",
]

log = logging.getLogger(__name__)

#: The KL max (nats per step) an arm may show against eager on the same device and dtype.
#: Full precision is tight: eager and a correct captured arm differ by reduction order only
#: (measured on the tiny Llama: 1.4e-15 in fp32), while one layer's MLP 1% off gives 4e-8.
#: The half types take pypto-precision's defaults until the gate measures their floor.
GATE_KL_MAX = {"float64": 1e-12, "float32": 1e-9, "float16": 1e-3, "bfloat16": 1e-2}

#: What every verdict is judged against, for the report.
NUMERICS_BASIS = "the eager arm's logits on the same device and dtype, teacher-forced"


@dataclass(frozen=True)
class Reference:
    """The eager pass the arms are judged against."""

    regime: str
    dtype: str
    logits: Any  # decode [B, n, V] (step 0: the prefill's last position); prefill [B, S, V]
    tokens: Any = None  # decode: the eager greedy tokens [B, n]


def _dtype(ctx: Context) -> str:
    return str(next(ctx.model.parameters()).dtype).replace("torch.", "")


def eager_reference(ctx: Context) -> Reference | None:
    """The eager reference of this run's regime (None: a regime the gate does not check)."""
    import torch

    regime = ctx.config.regime
    if regime == Regime.DECODE:
        from .protocol.decode import generate_logits

        tokens, logits = generate_logits(ctx)
        return Reference(regime, _dtype(ctx), logits, tokens)
    if regime == Regime.PREFILL:
        from .protocol.prefill import prefill_fn

        with torch.inference_mode():
            logits = prefill_fn(ctx)()
        return Reference(regime, _dtype(ctx), logits)
    return None


def _first_difference(tokens: Any, ref: Any) -> int:
    """Index of the first step where any row's token differs (the length if none)."""
    n = min(int(tokens.shape[1]), int(ref.shape[1]))
    differs = (tokens[:, :n].to(ref.device) != ref[:, :n]).any(dim=0)
    hits = differs.nonzero()
    return int(hits[0].item()) if hits.numel() else n


def _arm_logits(ctx: Context, arm: ArmResult, run: Any, ref: Reference) -> tuple[Any, Any, str]:
    """(arm logits, reference logits, basis) for ``arm``, built as it was timed."""
    fn = getattr(run, "__wrapped__", run)
    if ref.regime == Regime.PREFILL:
        import torch

        with torch.inference_mode():
            return fn(), ref.logits, "every prompt position's logits"
    forced = getattr(fn, "forced_logits", None)
    if forced is not None:
        return forced(ref.tokens), ref.logits, "teacher-forced with the eager tokens"
    free = getattr(fn, "free_logits", None)
    if free is not None:
        tokens, logits = free()
        n = min(_first_difference(tokens, ref.tokens) + 1, int(logits.shape[1]))
        total = int(ref.logits.shape[1])
        basis = (
            f"free-running up to the first differing token: {n} of {total} steps (each fed "
            "the eager tokens; transformers' generate takes no forced tokens)"
        )
        return logits[:, :n], ref.logits[:, :n], basis
    raise RuntimeError(f"the {arm.name} arm exposes no logits to check")


def arm_numerics(ctx: Context, arm: ArmResult, run: Any, ref: Reference | None) -> None:
    """Judge ``arm``'s logits against ``ref`` and record the verdict in ``arm.numerics``.

    ``run`` is the arm's built iteration (what the rounds timed). Never raises: a check
    that cannot run is recorded as ``not checked`` with the reason.
    """
    from pypto_precision import judge_logits, logit_metrics

    if arm.name == Arm.EAGER or not arm.ok:
        return
    if arm.outputs_differ_by_design:
        arm.numerics = {"verdict": "exempt", "why": arm.outputs_differ_by_design}
        return
    if ref is None:
        arm.numerics = {
            "verdict": "not checked",
            "why": f"the {ctx.config.regime} regime's logits are not checked yet",
        }
        return
    try:
        logits, reference, basis = _arm_logits(ctx, arm, run, ref)
        metrics = logit_metrics(logits, reference)
    except Exception as err:  # a check that cannot run is said, never fatal to the arm
        log.warning("%s: numerics not checked: %s", arm.name, err)
        arm.numerics = {"verdict": "not checked", "why": f"{type(err).__name__}: {err}"}
        return
    allowed = GATE_KL_MAX.get(ref.dtype, GATE_KL_MAX["float32"])
    check = judge_logits(
        metrics, ref.dtype, allowed=allowed, basis=f"the gate's {ref.dtype} allowance"
    )
    arm.numerics = {
        "verdict": "pass" if check.ok else "fail",
        "against": NUMERICS_BASIS,
        "basis": basis,
        "dtype": ref.dtype,
        "allowed_kl_max": check.allowed,
        "floor": check.floor,
        "metrics": metrics.to_dict(),
        "why": check.why,
    }
    if not check.ok:
        log.warning("%s: numerics fail: %s", arm.name, check.why)


def numerics_failed(arms: list[ArmResult]) -> list[ArmResult]:
    """The arms whose numbers the gate failed."""
    return [a for a in arms if (a.numerics or {}).get("verdict") == "fail"]


def after_hook(ctx: Context, ref: Reference | None) -> Callable[[ArmResult, Any], None]:
    """The ``after(arm, run)`` callback the schedules call with each arm still built."""

    def after(arm: ArmResult, run: Any) -> None:
        arm_numerics(ctx, arm, run, ref)

    return after
