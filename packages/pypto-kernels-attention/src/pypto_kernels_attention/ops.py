"""The ops callers use: envelope check, PyPTO kernel or counted fallback, custom ops.

Each op declares an :class:`Envelope`; a call outside it, or where PyPTO cannot run,
goes to the torch reference, counted and logged once per reason (pypto-kernels-common's
``KernelPackage.dispatch``). A kernel that fails *inside* its envelope raises
``KernelError``: a silent fallback would make the comparison meaningless.

Under torch.compile (``compiling()``), the ops are ``torch.library`` custom ops with a
fake implementation, so the captured step holds one opaque node per call and the
dispatch (and its counting) happens on every replay.
"""

from __future__ import annotations

import torch

from pypto_kernels_common import Backend, Envelope, compiling

from . import reference
from .package import PACKAGE

__all__ = [
    "DECODE_ENVELOPE",
    "SOFTMAX_ENVELOPE",
    "gqa_decode",
    "gqa_decode_from_length",
    "softmax",
]

MAX_SLOTS = 8192
MAX_HEAD_DIM = 512
MAX_GROUP = 64
MAX_SOFTMAX_COLS = 4096
# Slots per 32-byte block at 2-byte probabilities: the kernel sees multiples of this.
SLOT_ALIGN = 16


def _decode_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    *,
    softcap: float | None = None,
) -> str | None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return (
            f"q/k/v must be 4-D [B, H, 1, D] / [B, KV, S, D], got {q.dim()}/{k.dim()}/{v.dim()}-D"
        )
    b, h, sq, d = q.shape
    if sq != 1:
        return (
            f"{sq} query tokens: the decode kernel takes one (prefill uses the model's attention)"
        )
    if k.shape != v.shape or k.shape[0] != b or k.shape[-1] != d:
        return f"k {tuple(k.shape)} / v {tuple(v.shape)} do not match q {tuple(q.shape)}"
    kv, s = k.shape[1], k.shape[2]
    if kv == 0 or h % kv:
        return f"{h} query heads are not a multiple of {kv} KV heads"
    if h // kv > MAX_GROUP:
        return f"group {h // kv} outside envelope (<= {MAX_GROUP} query heads per KV head)"
    if d % 16 or not 16 <= d <= MAX_HEAD_DIM:
        return f"head_dim {d} outside envelope (multiple of 16 in 16..{MAX_HEAD_DIM})"
    if not 1 <= s <= MAX_SLOTS:
        return f"{s} cache slots outside envelope (1..{MAX_SLOTS})"
    if bias.device != q.device or not bias.is_floating_point():
        return f"bias must be a floating tensor on {q.device}, got {bias.dtype} on {bias.device}"
    if tuple(bias.shape) != (b, s):
        return f"bias {tuple(bias.shape)} must be [B, S] = [{b}, {s}]"
    if softcap is not None:
        return "attention softcapping is not in the kernel (PyPTO 0.2.0 has no tanh)"
    return None


def _softmax_rule(x: torch.Tensor) -> str | None:
    if x.dim() < 1 or x.numel() == 0:
        return f"empty or 0-d input {tuple(x.shape)}"
    cols = x.shape[-1]
    if cols % SLOT_ALIGN or not SLOT_ALIGN <= cols <= MAX_SOFTMAX_COLS:
        return f"row length {cols} outside envelope (multiple of {SLOT_ALIGN} up to {MAX_SOFTMAX_COLS})"
    return None


DECODE_ENVELOPE = Envelope("gqa_decode", rules=(_decode_rule,))
# The bias is fp32 whatever the io dtype: checked by the rule, not the dtype list.
SOFTMAX_ENVELOPE = Envelope("softmax", rules=(_softmax_rule,))


def _pad_slots(
    k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad the slot axis to a multiple of ``SLOT_ALIGN`` with hidden (bias -inf-like) slots.

    PyPTO's vector tiles need rows of whole 32-byte blocks (a 7-slot fp32 score row fails
    to compile). Real caches (1024-slot windows) are aligned already and pass through
    untouched; odd lengths (tiny test models) pay one copy.
    """
    s = k.shape[2]
    extra = -s % SLOT_ALIGN
    if not extra:
        return k, v, bias
    pad = torch.nn.functional.pad
    neg = torch.finfo(torch.float32).min
    return pad(k, (0, 0, 0, extra)), pad(v, (0, 0, 0, extra)), pad(bias, (0, extra), value=neg)


def _decode_eager(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    scaling: float,
    softcap: float | None,
) -> torch.Tensor:
    def kernel(bk: Backend) -> torch.Tensor:
        from . import kernels

        b, h, _, d = q.shape
        kv = k.shape[1]
        kk, vv, bb = _pad_slots(k, v, bias.to(torch.float32))
        out = torch.empty(b * h, d, dtype=q.dtype, device=q.device)
        kern = kernels.gqa_decode_kernel(
            bk,
            kernels.DecodeShape(b, h, kv, kk.shape[2], d),
            q.dtype,
            float(scaling),
            kernels.decode_tiles(q.dtype),
        )
        kern(
            q.reshape(b * h, d).contiguous(),
            kk.reshape(-1, d).contiguous(),
            vv.reshape(-1, d).contiguous(),
            bb.contiguous(),
            out,
        )
        return out.reshape(b, h, 1, d)

    def check() -> str | None:
        return DECODE_ENVELOPE.violation([q, k, v], bias=bias, softcap=softcap)

    return PACKAGE.dispatch(
        "gqa_decode",
        q.device.type,
        kernel,
        lambda: reference.gqa_decode_reference(q, k, v, bias, scaling, softcap),
        check=check,
    )


def _softmax_eager(x: torch.Tensor) -> torch.Tensor:
    def kernel(bk: Backend) -> torch.Tensor:
        from . import kernels

        cols = x.shape[-1]
        x2 = x.reshape(-1, cols).contiguous()
        out = torch.empty_like(x2)
        kernels.softmax_kernel(bk, cols, x.dtype)(x2, out)
        return out.reshape(x.shape)

    return PACKAGE.dispatch(
        "softmax",
        x.device.type,
        kernel,
        lambda: reference.softmax_reference(x),
        check=lambda: SOFTMAX_ENVELOPE.violation([x]),
    )


@torch.library.custom_op("pypto_attention::gqa_decode", mutates_args=())
def _gqa_decode_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    scaling: float,
    softcap: float | None,
) -> torch.Tensor:
    return _decode_eager(q, k, v, bias, scaling, softcap)


@_gqa_decode_op.register_fake
def _(q, k, v, bias, scaling, softcap):
    return torch.empty_like(q)


@torch.library.custom_op("pypto_attention::softmax", mutates_args=())
def _softmax_op(x: torch.Tensor) -> torch.Tensor:
    return _softmax_eager(x)


@_softmax_op.register_fake
def _(x):
    return torch.empty_like(x)


def gqa_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    scaling: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """One-token GQA attention over a static cache: ``q [B, H, 1, D]``, ``k/v [B, KV, S, D]``,
    additive ``bias [B, S]`` -> ``[B, H, 1, D]`` (see :mod:`.reference` for the contract)."""
    if compiling():
        if not PACKAGE.switches.is_on("gqa_decode"):
            return reference.gqa_decode_reference(q, k, v, bias, scaling, softcap)
        return _gqa_decode_op(q, k, v, bias, float(scaling), softcap)
    return _decode_eager(q, k, v, bias, scaling, softcap)


def gqa_decode_from_length(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    length: torch.Tensor,
    scaling: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """:func:`gqa_decode` with the visible slots given by a device-side valid ``length``
    (full layer) or the last ``window`` positions of a ring (sliding layer)."""
    bias = reference.valid_bias(length, k.shape[2], window).expand(q.shape[0], -1)
    return gqa_decode(q, k, v, bias, scaling, softcap)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Row softmax over the last dim (fp32 inside, the input dtype out)."""
    if compiling():
        if not PACKAGE.switches.is_on("softmax"):
            return reference.softmax_reference(x)
        return _softmax_op(x)
    return _softmax_eager(x)
