"""Per-tensor statistics: what a statistics-mode dump keeps of each output.

Why these: min / max / mean / L2 norm and the non-finite counts are what msprobe's
statistics mode keeps (so a 30B model's dump stays small and moves between machines); the
positional checksum tells two tensors with the same statistics but different contents
(a permutation, a swapped pair of heads) apart without copying the tensor to the host.
It is computed on the tensor's own device in float32: a fingerprint, not a cryptographic
hash (md5 mode adds the MD5 of the bytes for that).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch

__all__ = ["STAT_KEYS", "dtype_name", "md5_of", "tensor_stats"]

#: The numbers a statistics entry carries (non-finite values excluded from min/max/mean/norm).
STAT_KEYS = ("min", "max", "mean", "norm", "nan", "inf", "checksum")

# Positional weights cycle with this period: a prime, so a shift of any smaller stride
# changes the checksum.
_CHECKSUM_PERIOD = 251


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the name a dump records)."""
    return str(dtype).removeprefix("torch.")


def tensor_stats(t: torch.Tensor) -> dict[str, Any]:
    """Statistics of ``t`` over its finite elements, plus the non-finite counts.

    Floats of every width are reduced in float32 on the tensor's device (float64 stays
    float64); integer and bool tensors are converted. An empty tensor has null statistics.
    """
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    if x.dtype != torch.float64:  # every other dtype (integers, bool, low precision) in fp32
        x = x.to(torch.float32)
    x = x.reshape(-1)
    n = x.numel()
    nan = int(torch.isnan(x).sum().item()) if n else 0
    inf = int(torch.isinf(x).sum().item()) if n else 0
    finite = x[torch.isfinite(x)] if (nan or inf) else x
    if finite.numel() == 0:
        return {"min": None, "max": None, "mean": None, "norm": None, "nan": nan, "inf": inf,
                "checksum": None}  # fmt: skip
    weights = (torch.arange(n, device=x.device) % _CHECKSUM_PERIOD + 1).to(x.dtype)
    checksum = torch.where(torch.isfinite(x), x, torch.zeros_like(x)) * weights
    values = torch.stack(
        [finite.min(), finite.max(), finite.mean(), torch.linalg.vector_norm(finite),
         checksum.sum()]
    ).tolist()  # fmt: skip
    out: dict[str, Any] = dict(zip(("min", "max", "mean", "norm", "checksum"), values, strict=True))
    for key in ("mean", "norm", "checksum"):
        if not math.isfinite(out[key]):  # a float32 sum that overflowed: say so, as null
            out[key] = None
    out["nan"], out["inf"] = nan, inf
    return out


def md5_of(t: torch.Tensor) -> str:
    """MD5 of the tensor's bytes in its own dtype (contiguous, on the host)."""
    x = t.detach().contiguous().cpu()
    if x.dtype == torch.bfloat16:  # numpy has no bfloat16: hash the same bytes as int16
        x = x.view(torch.int16)
    return hashlib.md5(x.numpy().tobytes(), usedforsecurity=False).hexdigest()
