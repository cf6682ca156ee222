"""The two step ops: envelope, PyPTO kernel or counted fallback, custom op.

A call outside the envelope, or where PyPTO cannot run, goes to the torch reference,
counted and logged once per reason; a call inside it runs the kernel, and a kernel that
then fails raises :class:`KernelError` (a silent fallback would make the speed and
accuracy comparison meaningless). That rule is pypto-kernels-common's
``KernelPackage.dispatch``; this module holds the envelopes, the host-side conversion of
the per-head parameters and the custom ops.

Both ops update ``state`` in place and return the layer's gated-normed output, so the
layer's own code only projects in and out around them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pypto_kernels_common import Backend, Envelope, KernelError, compiling

from .package import PACKAGE
from .reference import gated_delta_step_reference, kda_step_reference

__all__ = [
    "GATED_DELTA_ENVELOPE",
    "KDA_ENVELOPE",
    "MAX_BATCH",
    "MAX_GROUP",
    "MAX_HEAD_DIM",
    "KernelError",
    "gated_delta_step",
    "kda_step",
]

#: Head dims up to 256 (a 256 x 256 fp32 head is four 128 x 128 state tiles).
MAX_HEAD_DIM = 256
#: Value heads per key head the kernel unrolls (Qwen3.5-9B: 2, Qwen3.6-27B: 3).
MAX_GROUP = 8
#: The step is a decode op: rows of a batch, one token each.
MAX_BATCH = 256


def _neg_exp(a_log: torch.Tensor) -> torch.Tensor:
    # Per-head parameters are a few hundred values: converted on every call rather than
    # cached per weight (a weight cache keys on the version counter, which the inference
    # tensors of a frozen compiled graph do not have).
    return (-a_log.float().exp()).reshape(-1, 1).contiguous()


def _dims_rule(*tensors: torch.Tensor) -> str | None:
    q, k, v = tensors[:3]
    if q.dim() != 3 or k.shape != q.shape or v.dim() != 3 or v.shape[0] != q.shape[0]:
        return f"q {tuple(q.shape)} / k {tuple(k.shape)} / v {tuple(v.shape)} must be [B, Hk, Dk] / [B, Hk, Dk] / [B, Hv, Dv]"
    bsz, hk, dk = q.shape
    hv, dv = v.shape[1:]
    if min(hk, hv, dk, dv) < 1:
        return f"empty heads: q {tuple(q.shape)}, v {tuple(v.shape)}"
    if hv % hk or hv // hk > MAX_GROUP:
        return f"{hv} value heads over {hk} key heads outside envelope (a multiple, at most {MAX_GROUP} per key head)"
    if dk % 8 or dv % 8 or dk > MAX_HEAD_DIM or dv > MAX_HEAD_DIM:
        return f"head dims {dk} x {dv} outside envelope (multiples of 8, at most {MAX_HEAD_DIM})"
    if not 1 <= bsz <= MAX_BATCH:
        return f"batch {bsz} outside envelope (1..{MAX_BATCH})"
    return None


def _state_rule(state: torch.Tensor, bsz: int, hv: int, dk: int, dv: int) -> str | None:
    if tuple(state.shape) != (bsz, hv, dk, dv):
        return f"state {tuple(state.shape)} must be [{bsz}, {hv}, {dk}, {dv}]"
    if state.dtype != torch.float32:
        return f"state dtype {state.dtype} is not float32 (the kernel keeps the state in fp32)"
    if not state.is_contiguous():
        return "state is not contiguous (the kernel updates it in place through a flat view)"
    return None


def _params_rule(
    named: Sequence[tuple[str, torch.Tensor, int]], device: torch.device
) -> str | None:
    for name, t, numel in named:
        if t.numel() != numel:
            return f"{name} has {t.numel()} values, not {numel}"
        if not t.is_floating_point():
            return f"{name} dtype {t.dtype} is not floating point"
        if t.device != device:
            return f"{name} on {t.device}, not {device}"
    return None


GATED_DELTA_ENVELOPE = Envelope("gated_delta_step", rules=(_dims_rule,))
KDA_ENVELOPE = Envelope("kda_step", rules=(_dims_rule,))


def _rows(t: torch.Tensor, cols: int) -> torch.Tensor:
    return t.reshape(-1, cols).contiguous()


def _gated_delta_eager(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    z: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    def check() -> str | None:
        reason = GATED_DELTA_ENVELOPE.violation([q, k, v, a, b, z])
        if reason:
            return reason
        bsz, _, dk = q.shape
        hv, dv = v.shape[1:]
        if tuple(z.shape) != (bsz, hv, dv) or tuple(a.shape) != (bsz, hv) or a.shape != b.shape:
            return f"z {tuple(z.shape)} / a {tuple(a.shape)} / b {tuple(b.shape)} must be [{bsz}, {hv}, {dv}] / [{bsz}, {hv}] / [{bsz}, {hv}]"
        return _state_rule(state, bsz, hv, dk, dv) or _params_rule(
            (
                ("A_log", A_log, hv),
                ("dt_bias", dt_bias, hv),
                ("norm_weight", norm_weight, dv),
                ("state", state, bsz * hv * dk * dv),
            ),
            q.device,
        )

    def kernel(bk: Backend) -> torch.Tensor:
        from . import kernels

        bsz, hk, dk = q.shape
        hv, dv = v.shape[1:]
        io = q.dtype
        round_weight = io != torch.float32 and torch.promote_types(norm_weight.dtype, io) == io
        fn = kernels.gated_delta_step_kernel(
            bk,
            bsz,
            hk,
            hv,
            dk,
            dv,
            io,
            float(eps),
            round_weight,
            kernels.step_tiles("gated_delta_step"),
        )
        flat = state.view(bsz * hv * dk, dv)
        out = torch.empty(bsz * hv, dv, dtype=io, device=q.device)
        fn(
            _rows(q, dk),
            _rows(k, dk),
            _rows(v, dv),
            _rows(a, 1),
            _rows(b, 1),
            _rows(z, dv),
            _neg_exp(A_log),
            dt_bias.float().reshape(-1, 1).contiguous(),
            norm_weight.float().reshape(1, -1).contiguous(),
            flat,
            flat,  # the same tensor: updated in place (see kernels' docstring)
            out,
        )
        return out.view(bsz, hv, dv)

    return PACKAGE.dispatch(
        "gated_delta_step",
        q.device.type,
        kernel,
        lambda: gated_delta_step_reference(
            q, k, v, a, b, z, A_log, dt_bias, norm_weight, state, eps
        ),
        check=check,
    )


def _kda_eager(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g_raw: torch.Tensor,
    b: torch.Tensor,
    gate: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    def check() -> str | None:
        reason = KDA_ENVELOPE.violation([q, k, v, g_raw, b, gate])
        if reason:
            return reason
        bsz, heads, dim = q.shape
        if tuple(v.shape) != (bsz, heads, dim):
            return f"KDA needs one value head per key head of the same dim: v {tuple(v.shape)} != q {tuple(q.shape)}"
        if g_raw.shape != q.shape or gate.shape != q.shape or tuple(b.shape) != (bsz, heads):
            return f"g_raw {tuple(g_raw.shape)} / gate {tuple(gate.shape)} / b {tuple(b.shape)} must be [{bsz}, {heads}, {dim}] / [{bsz}, {heads}, {dim}] / [{bsz}, {heads}]"
        return _state_rule(state, bsz, heads, dim, dim) or _params_rule(
            (
                ("A_log", A_log, heads),
                ("dt_bias", dt_bias, heads * dim),
                ("norm_weight", norm_weight, dim),
                ("state", state, bsz * heads * dim * dim),
            ),
            q.device,
        )

    def kernel(bk: Backend) -> torch.Tensor:
        from . import kernels

        bsz, heads, dim = q.shape
        io = q.dtype
        fn = kernels.kda_step_kernel(
            bk, bsz, heads, dim, io, float(eps), kernels.step_tiles("kda_step")
        )
        flat = state.view(bsz * heads * dim, dim)
        out = torch.empty(bsz * heads, dim, dtype=io, device=q.device)
        fn(
            _rows(q, dim),
            _rows(k, dim),
            _rows(v, dim),
            _rows(g_raw, dim),
            _rows(b, 1),
            _rows(gate, dim),
            _neg_exp(A_log),
            dt_bias.float().reshape(heads, dim).contiguous(),
            norm_weight.float().reshape(1, -1).contiguous(),
            flat,
            flat,
            out,
        )
        return out.view(bsz, heads, dim)

    return PACKAGE.dispatch(
        "kda_step",
        q.device.type,
        kernel,
        lambda: kda_step_reference(
            q, k, v, g_raw, b, gate, A_log, dt_bias, norm_weight, state, eps
        ),
        check=check,
    )


# The dispatch above does host work (envelope, packing, PyPTO's launch and counting) that
# torch.compile cannot trace. Under compile a switched-on op is one opaque custom op
# whose body is that dispatch, so a captured step runs (and counts) it on every replay;
# it declares the state it mutates, so the compiled graph orders reads after it.


@torch.library.custom_op("pypto_linear_attention::gated_delta_step", mutates_args=("state",))
def _gated_delta_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    z: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    return _gated_delta_eager(q, k, v, a, b, z, A_log, dt_bias, norm_weight, state, eps)


@_gated_delta_op.register_fake
def _(q, k, v, a, b, z, A_log, dt_bias, norm_weight, state, eps):
    return torch.empty_like(v)


@torch.library.custom_op("pypto_linear_attention::kda_step", mutates_args=("state",))
def _kda_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g_raw: torch.Tensor,
    b: torch.Tensor,
    gate: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    return _kda_eager(q, k, v, g_raw, b, gate, A_log, dt_bias, norm_weight, state, eps)


@_kda_op.register_fake
def _(q, k, v, g_raw, b, gate, A_log, dt_bias, norm_weight, state, eps):
    return torch.empty_like(v)


def gated_delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    z: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """One Gated DeltaNet decode step in one PyPTO kernel (switch ``gated_delta_step``).

    Same contract as :func:`~.reference.gated_delta_step_reference` (``state`` updated in
    place). Inside torch.compile a switched-on call is the opaque
    ``pypto_linear_attention::gated_delta_step`` op; a switched-off one traces as the
    reference, so the graph stays pure torch.
    """
    if compiling():
        if not PACKAGE.switches.is_on("gated_delta_step"):
            return gated_delta_step_reference(
                q, k, v, a, b, z, A_log, dt_bias, norm_weight, state, eps
            )
        return _gated_delta_op(q, k, v, a, b, z, A_log, dt_bias, norm_weight, state, float(eps))
    return _gated_delta_eager(q, k, v, a, b, z, A_log, dt_bias, norm_weight, state, float(eps))


def kda_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g_raw: torch.Tensor,
    b: torch.Tensor,
    gate: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """One KDA decode step in one PyPTO kernel (switch ``kda_step``).

    Same contract as :func:`~.reference.kda_step_reference` (``state`` updated in place);
    under torch.compile the opaque ``pypto_linear_attention::kda_step`` op when on.
    """
    if compiling():
        if not PACKAGE.switches.is_on("kda_step"):
            return kda_step_reference(
                q, k, v, g_raw, b, gate, A_log, dt_bias, norm_weight, state, eps
            )
        return _kda_op(q, k, v, g_raw, b, gate, A_log, dt_bias, norm_weight, state, float(eps))
    return _kda_eager(q, k, v, g_raw, b, gate, A_log, dt_bias, norm_weight, state, float(eps))
