"""The error metrics of one entry: target against reference.

The field's set (msprobe's compare columns): cosine similarity, Euclidean distance, max
absolute and max relative error, RMSE, and the one- and five-thousandths ratios (the share
of elements whose relative error is under 0.001 / 0.005: a trend, not a verdict). Added
here: the relative L2 error ``||target - reference|| / ||reference||``, the scale-free
number the rule judges (pypto_precision.rule), and the non-finite mismatches (a NaN or
inf on one side only), which fail an entry whatever else it shows.

Everything is computed in float64 on the host. Relative errors divide by
``max(|reference|, cutoff)`` with the small-value cut-off of the target's dtype (msprobe's
pre-check: 2^-8 bf16, 2^-11 fp16, 2^-14 fp32), so a reference element of 1e-30 does not
turn a rounding into an "infinite" relative error.

Statistics-only dumps have no elements to compare: :func:`stats_metrics` compares their
norms, means and extremes, and the rule judges the relative difference of the norms.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["SMALL_VALUE", "stats_metrics", "tensor_metrics"]

#: Small-value cut-off per target dtype (relative errors divide by at least this).
SMALL_VALUE = {
    "bfloat16": 2.0**-8,
    "float16": 2.0**-11,
    "float32": 2.0**-14,
    "float64": 2.0**-30,
}
_DEFAULT_SMALL = 2.0**-14


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def tensor_metrics(target: torch.Tensor, reference: torch.Tensor) -> dict[str, Any]:
    """Metrics of ``target`` against ``reference`` (same number of elements)."""
    a = target.detach().to("cpu", torch.float64).reshape(-1)
    b = reference.detach().to("cpu", torch.float64).reshape(-1)
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    # NaN where the other is inf, or finite on one side only: both count.
    mismatch = int((fa != fb).sum().item()) + int(
        (~fa & ~fb & ~((torch.isnan(a) & torch.isnan(b)) | (a == b))).sum().item()
    )
    both = fa & fb
    a, b = a[both], b[both]
    n = a.numel()
    out: dict[str, Any] = {"elements": int(target.numel()), "nonfinite_mismatch": mismatch}
    if n == 0:
        out.update(cosine=None, euclidean=None, max_abs=None, max_rel=None, rmse=None,
                   rel_l2=None, one_thousandth=None, five_thousandths=None)  # fmt: skip
        return out
    diff = a - b
    cutoff = SMALL_VALUE.get(str(target.dtype).removeprefix("torch."), _DEFAULT_SMALL)
    rel = diff.abs() / b.abs().clamp_min(cutoff)
    na, nb, nd = (torch.linalg.vector_norm(v).item() for v in (a, b, diff))
    if na == 0 and nb == 0:
        cosine = 1.0
    elif na == 0 or nb == 0:
        cosine = 0.0
    else:
        cosine = float(torch.dot(a, b).item() / (na * nb))
    out.update(
        cosine=_finite(cosine),
        euclidean=_finite(nd),
        max_abs=_finite(diff.abs().max().item()),
        max_rel=_finite(rel.max().item()),
        rmse=_finite(math.sqrt((diff * diff).mean().item())),
        rel_l2=_finite(nd / nb) if nb > 0 else (0.0 if nd == 0 else None),
        one_thousandth=float((rel < 1e-3).double().mean().item()),
        five_thousandths=float((rel < 5e-3).double().mean().item()),
    )
    return out


def stats_metrics(target: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """What two statistics entries can say: differences of norm, mean, min and max."""

    def rel(key: str) -> float | None:
        x, y = target.get(key), reference.get(key)
        if x is None or y is None:
            return None
        if y == 0:
            return 0.0 if x == 0 else None
        return abs(x - y) / abs(y)

    def absdiff(key: str) -> float | None:
        x, y = target.get(key), reference.get(key)
        return None if x is None or y is None else abs(x - y)

    t_bad = (target.get("nan") or 0) + (target.get("inf") or 0)
    r_bad = (reference.get("nan") or 0) + (reference.get("inf") or 0)
    return {
        "norm_rel": rel("norm"),
        "mean_abs": absdiff("mean"),
        "max_abs_of_max": absdiff("max"),
        "max_abs_of_min": absdiff("min"),
        "nonfinite_mismatch": abs(t_bad - r_bad),
        "checksum_equal": target.get("checksum") == reference.get("checksum"),
    }
