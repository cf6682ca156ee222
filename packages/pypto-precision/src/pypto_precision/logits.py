"""Teacher-forced logits: the standard a fast arm is held to.

Free-running greedy tokens are a weak signal: one flipped token in bf16 and every later
position "differs", while a 1% error in one layer can leave every argmax unchanged. Here
both runs are fed the *reference's* tokens (teacher forcing), so each step is judged on its
own: per-step KL divergence of the target's distribution from the reference's (mean, p99,
max), top-1 agreement, and the largest change of the reference token's log-probability.
Non-finite logits fail, always (the argmax of NaN is a token too).

The thresholds follow the noise-floor rule (pypto_precision.rule): the KL a target dtype is
allowed is ``k`` x the KL that dtype shows against the reference on a trusted device, with
a per-dtype minimum; without a floor, the dtype's default.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .rule import DEFAULT_K

__all__ = [
    "KL_DEFAULT",
    "KL_MIN",
    "MAX_KL_STEPS",
    "LogitCheck",
    "LogitMetrics",
    "judge_logits",
    "logit_metrics",
]

#: KL (nats per step, the max over steps) allowed without a floor, by target dtype.
KL_DEFAULT = {"float64": 1e-12, "float32": 1e-7, "float16": 1e-3, "bfloat16": 1e-2}
#: At most this many per-step KL values are kept (a long generation keeps its first steps).
MAX_KL_STEPS = 256
#: Least KL allowed with a measured floor.
KL_MIN = {"float64": 1e-14, "float32": 1e-9, "float16": 1e-5, "bfloat16": 1e-4}


@dataclass(frozen=True)
class LogitMetrics:
    """Teacher-forced agreement of a target's logits with the reference's, over ``steps``."""

    steps: int
    kl_mean: float | None
    kl_p99: float | None
    kl_max: float | None
    top1_agreement: float
    max_abs_dlogprob: float | None
    greedy_prefix: int
    nonfinite: int
    #: KL per teacher-forced step (the mean over rows), the first :data:`MAX_KL_STEPS`:
    #: where along the generation the error grows (the report page plots it).
    kl_steps: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LogitCheck:
    """The verdict on :class:`LogitMetrics`: the KL max judged against ``allowed``."""

    ok: bool
    metrics: LogitMetrics
    allowed: float
    floor: float | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "metrics": self.metrics.to_dict(), "allowed": self.allowed,
                "floor": self.floor, "why": self.why}  # fmt: skip


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def logit_metrics(target: torch.Tensor, reference: torch.Tensor) -> LogitMetrics:
    """Metrics of ``target`` logits against ``reference`` logits, both ``[steps, vocab]``
    (or ``[batch, steps, vocab]``, flattened), computed in float64 on the host. The
    reference token of each step is the reference's argmax (greedy teacher forcing)."""
    if target.shape != reference.shape:
        raise ValueError(f"logits differ in shape: {list(target.shape)} vs {list(reference.shape)}")
    t = target.detach().to("cpu", torch.float64).reshape(-1, target.shape[-1])
    r = reference.detach().to("cpu", torch.float64).reshape(-1, reference.shape[-1])
    steps = t.shape[0]
    nonfinite = int((~torch.isfinite(t)).any(dim=-1).sum().item())
    ref_tok = r.argmax(dim=-1)
    tgt_tok = t.argmax(dim=-1)
    agree = tgt_tok == ref_tok
    prefix = int(agree.long().cumprod(0).sum().item()) if steps else 0
    if nonfinite or steps == 0:
        return LogitMetrics(steps, None, None, None, float(agree.double().mean().item()) if steps
                            else 1.0, None, prefix, nonfinite)  # fmt: skip
    lt, lr = torch.log_softmax(t, dim=-1), torch.log_softmax(r, dim=-1)
    # KL(reference || target): how much the target's distribution loses of the reference's.
    kl = (lr.exp() * (lr - lt)).sum(dim=-1).clamp_min(0.0)
    dlp = (lt.gather(-1, ref_tok[:, None]) - lr.gather(-1, ref_tok[:, None])).abs()
    per_step = kl.view(target.shape[0], -1).mean(dim=0) if target.dim() == 3 else kl
    return LogitMetrics(
        steps=steps,
        kl_mean=_finite(kl.mean().item()),
        kl_p99=_finite(torch.quantile(kl, 0.99).item()),
        kl_max=_finite(kl.max().item()),
        top1_agreement=float(agree.double().mean().item()),
        max_abs_dlogprob=_finite(dlp.max().item()),
        greedy_prefix=prefix,
        nonfinite=0,
        kl_steps=[float(v) for v in per_step[:MAX_KL_STEPS].tolist()],
    )


def judge_logits(
    metrics: LogitMetrics,
    dtype: str,
    *,
    floor: LogitMetrics | None = None,
    k: float = DEFAULT_K,
    allowed: float | None = None,
    basis: str | None = None,
) -> LogitCheck:
    """Pass when the logits are finite and the KL max is within the allowance for ``dtype``
    (``k`` x the floor's KL max, at least ``KL_MIN``; else ``KL_DEFAULT``). ``allowed``
    (with ``basis``, the words for where it comes from) overrides both: a caller with its
    own rule, e.g. pypto-bench's gate (an arm against eager on the same device and dtype)."""
    floor_kl = floor.kl_max if floor is not None else None
    if allowed is not None:
        basis = basis or "the caller's allowance"
    elif floor_kl is not None:
        allowed = max(k * floor_kl, KL_MIN.get(dtype, 1e-9))
        basis = f"{k:g} x floor {floor_kl:.3g}"
    else:
        allowed = KL_DEFAULT.get(dtype, 1e-7)
        basis = f"{dtype} default"
    if metrics.nonfinite:
        return LogitCheck(False, metrics, allowed, floor_kl,
                          f"non-finite logits at {metrics.nonfinite} of {metrics.steps} steps")  # fmt: skip
    if metrics.kl_max is None:
        return LogitCheck(False, metrics, allowed, floor_kl, "KL could not be computed")
    ok = metrics.kl_max <= allowed
    why = (
        f"KL max {metrics.kl_max:.3g} {'<=' if ok else '>'} {allowed:.3g} ({basis}); top-1 "
        f"agreement {metrics.top1_agreement:.1%}"
    )
    return LogitCheck(ok, metrics, allowed, floor_kl, why)
