"""PyPTO attention kernels: GQA decode attention over a static KV cache and the
eager-attention softmax, with switches, envelopes, counted fallbacks, custom ops for
captured steps and a Gemma 4 plug-in (see README.md)."""

from __future__ import annotations

from typing import Any

from .ops import DECODE_ENVELOPE, SOFTMAX_ENVELOPE, gqa_decode, gqa_decode_from_length, softmax
from .package import OPS, PACKAGE
from .reference import gqa_decode_reference, ring_valid, softmax_reference, valid_bias

__version__ = "0.1.0"

__all__ = [
    "DECODE_ENVELOPE",
    "OPS",
    "PACKAGE",
    "SOFTMAX_ENVELOPE",
    "gqa_decode",
    "gqa_decode_from_length",
    "gqa_decode_reference",
    "report",
    "ring_valid",
    "softmax",
    "softmax_reference",
    "valid_bias",
]


def report() -> dict[str, Any]:
    """Switches, per-op call counts by backend and the last fallback reason per op."""
    return PACKAGE.report()
