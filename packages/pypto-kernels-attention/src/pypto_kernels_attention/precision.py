"""Precision cases: this package's cases in pypto-kernels-common's one JSON schema.

Decode cases give the cache's valid ``length`` as an int input and the sliding
``window`` (0: a full layer) as a value, so the visibility bias is built exactly as a
caller builds it (:func:`.reference.valid_bias`, on the device) rather than stored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pypto_kernels_common.precision import Case, PrecisionSuite, compare, make_inputs

from . import ops, reference

__all__ = ["SUITE", "Case", "compare", "make_inputs"]


def _decode(kernel: bool) -> Callable[..., dict[str, torch.Tensor]]:
    def run(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        length: torch.Tensor,
        window: int,
        scaling: float,
    ) -> dict[str, torch.Tensor]:
        bias = reference.valid_bias(length, k.shape[2], window or None).expand(q.shape[0], -1)
        if kernel:
            return {"out": ops.gqa_decode(q, k, v, bias, scaling)}
        return {"out": reference.gqa_decode_reference(q, k, v, bias, scaling)}

    return run


def _softmax(kernel: bool) -> Callable[..., dict[str, torch.Tensor]]:
    def run(scores: torch.Tensor) -> dict[str, Any]:
        return {"probs": ops.softmax(scores) if kernel else reference.softmax_reference(scores)}

    return run


SUITE = PrecisionSuite("pypto_kernels_attention", {"gqa_decode": _decode, "softmax": _softmax})
