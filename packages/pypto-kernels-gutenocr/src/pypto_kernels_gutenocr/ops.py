"""Wrappers the model calls: envelope check, PyPTO kernel or counted fallback.

Each op declares an :class:`Envelope` (dtypes, shape rules, devices). A call
outside it, or on a machine where PyPTO cannot run, goes to the torch reference
and is counted and logged once with the reason (see :mod:`.stats`). A call inside
the envelope runs the PyPTO kernel; a kernel that then fails raises
:class:`KernelError` rather than being papered over, because a silent fallback
would make the accuracy/speed comparison meaningless. That rule is
pypto-kernels-common's ``KernelPackage.dispatch``; this module holds the GutenOCR
envelopes, the kernel calls and the torch.compile custom ops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, cast

import torch

from pypto_kernels_common import Backend, Envelope, KernelError, PackCache, compiling

from . import reference, switches
from .package import PACKAGE

__all__ = [
    "ENVELOPES",
    "PACKED",
    "Envelope",
    "KernelError",
    "PackCache",
    "mrope_pto_correct",
    "rms_norm_wrapper",
    "swiglu_mlp_wrapper",
]


def _hidden_rule(x: torch.Tensor, weight: torch.Tensor, **_: object) -> str | None:
    h = x.shape[-1]
    if weight.shape != (h,):
        return f"weight shape {tuple(weight.shape)} != ({h},)"
    if h % 64 or not 64 <= h <= 8192:
        return f"hidden {h} outside envelope (multiple of 64 in 64..8192)"
    return None


def _mrope_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    sections: Sequence[int],
) -> str | None:
    if q.dim() != 4 or k.dim() != 4:
        return f"q/k must be [B, H, S, D], got {tuple(q.shape)} / {tuple(k.shape)}"
    b, _, s, d = q.shape
    if k.shape[0] != b or k.shape[2:] != q.shape[2:]:
        return f"k {tuple(k.shape)} does not match q {tuple(q.shape)}"
    if cos.shape != (3, b, s, d) or sin.shape != cos.shape:
        return f"cos/sin must be [3, {b}, {s}, {d}], got {tuple(cos.shape)}"
    if d % 64 or s > 8192:
        return f"head_dim {d} / seq {s} outside envelope (head_dim multiple of 64, seq <= 8192)"
    return None


def _swiglu_rule(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
) -> str | None:
    if x.dim() != 2:
        return f"x must be [N, hidden], got {tuple(x.shape)}"
    h, i = w_gate.shape
    if x.shape[1] != h or w_up.shape != (h, i) or w_down.shape != (i, h):
        return "weight shapes do not form an MLP for this x"
    if h % 64 or i % 64 or h > 8192 or i > 32768:
        return f"hidden {h} / intermediate {i} outside envelope (multiples of 64)"
    return None


RMS_NORM_ENVELOPE = Envelope("rms_norm", rules=(_hidden_rule,))
MROPE_ENVELOPE = Envelope("mrope", rules=(_mrope_rule,))
SWIGLU_ENVELOPE = Envelope("swiglu_mlp", rules=(_swiglu_rule,))
ENVELOPES = {e.op: e for e in (RMS_NORM_ENVELOPE, MROPE_ENVELOPE, SWIGLU_ENVELOPE)}


# --------------------------------------------------------------------------- packing

# nn.Linear weights transposed once per weight tensor (not per call).
PACKED = PackCache()


# --------------------------------------------------------------------------- wrappers


def _rms_norm_eager(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    def kernel(bk: Backend) -> torch.Tensor:
        from . import kernels

        h = hidden_states.shape[-1]
        x2 = hidden_states.reshape(-1, h).contiguous()
        out = torch.empty_like(x2)
        kern = kernels.rms_norm_kernel(bk, h, x2.dtype, float(eps), kernels.rms_tiles(x2.dtype))
        kern(x2, weight.detach().contiguous(), out)
        return out.reshape(hidden_states.shape)

    return PACKAGE.dispatch(
        "rms_norm",
        hidden_states.device.type,
        kernel,
        lambda: reference.rms_norm_reference(hidden_states, weight, eps),
        check=lambda: RMS_NORM_ENVELOPE.violation([hidden_states, weight]),
    )


def _mrope_eager(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mrope_section: Sequence[int],
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    sections = tuple(int(s) for s in mrope_section)
    if len(sections) != 3 or 2 * sum(sections) != q.shape[-1]:
        # Neither the kernel nor the reference can compute this: a caller bug.
        raise ValueError(f"mrope_section {list(sections)} does not cover head_dim {q.shape[-1]}")

    def check() -> str | None:
        if unsqueeze_dim != 1:
            return f"unsqueeze_dim {unsqueeze_dim} (kernel expects [B, H, S, D], unsqueeze_dim=1)"
        return MROPE_ENVELOPE.violation([q, k, cos, sin], sections=sections)

    def kernel(bk: Backend) -> tuple[torch.Tensor, torch.Tensor]:
        from . import kernels

        b, hq, s, d = q.shape
        qc, kc = q.contiguous(), k.contiguous()
        q_out, k_out = torch.empty_like(qc), torch.empty_like(kc)
        kern = kernels.mrope_kernel(bk, b, hq, k.shape[1], s, d, sections, q.dtype)
        kern(qc, kc, cos.contiguous(), sin.contiguous(), q_out, k_out)
        return q_out, k_out

    return PACKAGE.dispatch(
        "mrope",
        q.device.type,
        kernel,
        lambda: reference.mrope_reference(q, k, cos, sin, sections, unsqueeze_dim),
        check=check,
    )


def _is_silu(mlp_module: torch.nn.Module) -> bool:
    act = getattr(mlp_module, "act_fn", None)
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")


class _GatedMLP(Protocol):
    """What a gated (SwiGLU) MLP module holds, as far as the type checker is concerned."""

    gate_proj: torch.nn.Linear
    up_proj: torch.nn.Linear
    down_proj: torch.nn.Linear
    act_fn: Callable[[torch.Tensor], torch.Tensor]


def _mlp_reference(mlp_module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    # The module's own projections (never mlp_module(x): its forward may be the hook
    # that called us). Same ops as transformers' Qwen2MLP, so "off" is bit-identical.
    for name in ("gate_proj", "up_proj", "down_proj", "act_fn"):
        if not hasattr(mlp_module, name):
            raise TypeError(f"{type(mlp_module).__name__} is not a gated MLP (no {name})")
    # nn.Module.__getattr__ is typed Tensor | Module; these are the MLP's submodules.
    m = cast(_GatedMLP, mlp_module)
    return m.down_proj(m.act_fn(m.gate_proj(x)) * m.up_proj(x))


def _structural_reason(mlp_module: torch.nn.Module) -> str | None:
    """Why this module cannot be one fused SwiGLU kernel (pure attribute checks)."""
    layers = [getattr(mlp_module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    linears = [m for m in layers if isinstance(m, torch.nn.Linear)]
    if len(linears) != len(layers):
        return "module has no gate_proj/up_proj/down_proj Linear layers"
    if any(m.bias is not None for m in linears):
        return "MLP projections carry a bias"
    if not _is_silu(mlp_module):
        return f"activation {type(getattr(mlp_module, 'act_fn', None)).__name__} is not SiLU"
    return None


def _swiglu_eager(
    hidden_states: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor
) -> torch.Tensor:
    """The fused kernel for a structurally fitting MLP, or its reference (same ops as
    nn.Linear/SiLU without bias, so "off" stays bit-identical)."""
    h = hidden_states.shape[-1]
    x2 = hidden_states.reshape(-1, h)
    w_gate = PACKED.transposed(gate_w)
    w_up = PACKED.transposed(up_w)
    w_down = PACKED.transposed(down_w)

    def fallback() -> torch.Tensor:
        f = torch.nn.functional
        return f.linear(
            f.silu(f.linear(hidden_states, gate_w)) * f.linear(hidden_states, up_w), down_w
        )

    def kernel(bk: Backend) -> torch.Tensor:
        from . import kernels

        xc = x2.contiguous()
        out = torch.empty_like(xc)
        kern = kernels.swiglu_mlp_kernel(
            bk, h, w_gate.shape[1], xc.dtype, kernels.swiglu_tiles(xc.dtype)
        )
        kern(xc, w_gate, w_up, w_down, out)
        return out.reshape(hidden_states.shape)

    return PACKAGE.dispatch(
        "swiglu_mlp",
        hidden_states.device.type,
        kernel,
        fallback,
        check=lambda: SWIGLU_ENVELOPE.violation([x2, w_gate, w_up, w_down]),
    )


# --------------------------------------------------------------------------- capture
# The dispatch above does host work (envelope checks, backend choice, PyPTO's own launch
# and counting) that torch.compile cannot trace: a graph break, i.e. a failed capture.
# Under compile every switched-ON op is therefore one opaque custom op whose body is that
# dispatch, so a captured step runs the kernel, and counts it, on every replay. A
# switched-OFF op traces as the plain reference, so the graph arm stays one pure graph.


_compiling = compiling


@torch.library.custom_op("pypto_gutenocr::rms_norm", mutates_args=())
def _rms_norm_op(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _rms_norm_eager(hidden_states, weight, eps)


@_rms_norm_op.register_fake
def _(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(hidden_states)


@torch.library.custom_op("pypto_gutenocr::mrope", mutates_args=())
def _mrope_op(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mrope_section: list[int],
    unsqueeze_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _mrope_eager(q, k, cos, sin, mrope_section, unsqueeze_dim)


@_mrope_op.register_fake
def _(q, k, cos, sin, mrope_section, unsqueeze_dim):
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op("pypto_gutenocr::swiglu_mlp", mutates_args=())
def _swiglu_op(
    hidden_states: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor
) -> torch.Tensor:
    return _swiglu_eager(hidden_states, gate_w, up_w, down_w)


@_swiglu_op.register_fake
def _(hidden_states, gate_w, up_w, down_w):
    return torch.empty_like(hidden_states)


# --------------------------------------------------------------------------- public


def rms_norm_wrapper(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim through PyPTO when on and inside the envelope."""
    if _compiling():
        if not switches.is_on("rms_norm"):
            return reference.rms_norm_reference(hidden_states, weight, eps)
        return _rms_norm_op(hidden_states, weight, float(eps))
    return _rms_norm_eager(hidden_states, weight, eps)


def mrope_pto_correct(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mrope_section: Sequence[int],
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multimodal RoPE on q/k with 3-axis cos/sin [3, B, S, D], split by ``mrope_section``."""
    if _compiling():
        sections = [int(s) for s in mrope_section]
        if len(sections) != 3 or 2 * sum(sections) != q.shape[-1]:
            raise ValueError(f"mrope_section {sections} does not cover head_dim {q.shape[-1]}")
        if not switches.is_on("mrope"):
            return reference.mrope_reference(q, k, cos, sin, tuple(sections), unsqueeze_dim)
        return _mrope_op(q, k, cos, sin, sections, int(unsqueeze_dim))
    return _mrope_eager(q, k, cos, sin, mrope_section, unsqueeze_dim)


def swiglu_mlp_wrapper(mlp_module: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """``down(silu(gate(x)) * up(x))`` for an HF MLP module, fused in one PyPTO kernel."""
    if not switches.is_on("swiglu_mlp"):
        if not _compiling():
            PACKAGE.stats.record_fallback("swiglu_mlp", "switch USE_PTO_SWIGLU_MLP is off")
        return _mlp_reference(mlp_module, hidden_states)
    reason = _structural_reason(mlp_module)
    if reason is not None:
        if not _compiling():
            PACKAGE.stats.record_fallback("swiglu_mlp", reason)
        return _mlp_reference(mlp_module, hidden_states)
    m = cast(_GatedMLP, mlp_module)  # _structural_reason found three nn.Linear layers
    weights = (m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight)
    if _compiling():
        return _swiglu_op(hidden_states, *weights)
    return _swiglu_eager(hidden_states, *weights)
