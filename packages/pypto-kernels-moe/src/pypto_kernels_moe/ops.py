"""The grouped-GEMM experts op: envelope, PyPTO kernel or counted fallback, custom op.

A call outside the envelope, or where PyPTO cannot run, goes to the torch reference,
counted and logged once per reason; a call inside it runs the kernel, and a kernel that
then fails raises :class:`KernelError` (a silent fallback would make the speed and
accuracy comparison meaningless). That rule is pypto-kernels-common's
``KernelPackage.dispatch``; this module holds the MoE envelope and the custom op.
"""

from __future__ import annotations

import torch

from pypto_kernels_common import Backend, Envelope, KernelError, compiling

from .package import PACKAGE
from .reference import (
    ACTIVATION_NAMES,
    ascending_slots,
    combine,
    expert_major_grouping,
    grouped_gemm_reference,
)

__all__ = [
    "ENVELOPE",
    "EXPERT_MAJOR_MIN_TOKENS",
    "MAX_HIDDEN",
    "MAX_INTER",
    "MAX_TOKENS",
    "MAX_TOP_K",
    "KernelError",
    "grouped_gemm",
]

MAX_HIDDEN = 8192
MAX_INTER = 4096
MAX_TOP_K = 16
#: The kernel loops over tokens; beyond this a prefill is cheaper as the model's own loop.
MAX_TOKENS = 4096
#: Calls with at least this many tokens run the expert-major kernel (each expert's
#: weights read once per row tile over its routed rows); fewer run the token-major one
#: (each token reads its k experts). See the README for the cost-model crossover.
EXPERT_MAJOR_MIN_TOKENS = 64


def _shape_rule(
    x: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> str | None:
    if x.dim() != 2 or ids.dim() != 2 or ids.shape[0] != x.shape[0]:
        return f"hidden_states {tuple(x.shape)} / top_k_index {tuple(ids.shape)} must be [T, H] / [T, k]"
    h = x.shape[1]
    if gate_up.dim() != 3 or down.dim() != 3 or gate_up.shape[2] != h:
        return f"gate_up {tuple(gate_up.shape)} must be [E, 2I, {h}]"
    e, two_i, _ = gate_up.shape
    i = two_i // 2
    if two_i % 2 or tuple(down.shape) != (e, h, i):
        return (
            f"down {tuple(down.shape)} must be [{e}, {h}, {i}] for gate_up {tuple(gate_up.shape)}"
        )
    if h % 16 or i % 16 or h > MAX_HIDDEN or i > MAX_INTER:
        return (
            f"hidden {h} / expert intermediate {i} outside envelope "
            f"(multiples of 16, hidden <= {MAX_HIDDEN}, intermediate <= {MAX_INTER})"
        )
    if not 1 <= ids.shape[1] <= MAX_TOP_K or ids.shape[1] > e:
        return f"top_k {ids.shape[1]} outside envelope (1..{MAX_TOP_K}, at most {e} experts)"
    if not 1 <= x.shape[0] <= MAX_TOKENS:
        return f"{x.shape[0]} tokens outside envelope (1..{MAX_TOKENS})"
    return None


ENVELOPE = Envelope("grouped_gemm", rules=(_shape_rule,), index_dtypes=(torch.int32, torch.int64))


def _check_activation(act: str) -> None:
    if act not in ACTIVATION_NAMES:
        # Neither the kernel nor the reference can compute it: a caller bug, not a fallback.
        raise ValueError(f"unknown activation {act!r}; choose one of {', '.join(ACTIVATION_NAMES)}")


def _eager(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: str,
    alpha: float,
    limit: float,
) -> torch.Tensor:
    def check() -> str | None:
        if top_k_weights.shape != top_k_index.shape:
            return f"top_k_weights {tuple(top_k_weights.shape)} != top_k_index {tuple(top_k_index.shape)}"
        if not top_k_weights.is_floating_point():
            return f"top_k_weights dtype {top_k_weights.dtype} is not floating point"
        return ENVELOPE.violation([hidden_states, top_k_index, gate_up, down])

    def kernel(bk: Backend) -> torch.Tensor:
        from . import kernels

        ids, weights = ascending_slots(top_k_index, top_k_weights)
        x = hidden_states.contiguous()
        e, two_i, h = gate_up.shape
        t, k = ids.shape
        if t >= EXPERT_MAJOR_MIN_TOKENS:
            g = expert_major_grouping(x, ids, weights, e, kernels.token_bucket(t))
            ys = torch.empty_like(g.xs)
            kernels.expert_major_kernel(
                bk,
                h,
                two_i // 2,
                e,
                x.dtype,
                act,
                float(alpha),
                float(limit),
                kernels.expert_major_tiles(x.dtype),
            )(g.xs, g.ws, g.offsets, gate_up.detach().contiguous(), down.detach().contiguous(), ys)
            return combine(ys, g.pos, t, k)
        out = torch.empty_like(x)
        kern = kernels.grouped_gemm_kernel(
            bk,
            ids.shape[1],
            h,
            two_i // 2,
            e,
            x.dtype,
            act,
            float(alpha),
            float(limit),
            kernels.grouped_tiles(x.dtype),
        )
        kern(
            x,
            ids.to(torch.int32).contiguous(),
            weights.to(torch.float32).contiguous(),
            gate_up.detach().contiguous(),
            down.detach().contiguous(),
            x.new_empty(t, k * h),  # scratch: each slot's contribution, summed in order
            out,
        )
        return out

    return PACKAGE.dispatch(
        "grouped_gemm",
        hidden_states.device.type,
        kernel,
        lambda: grouped_gemm_reference(
            hidden_states, top_k_index, top_k_weights, gate_up, down, act, alpha, limit
        ),
        check=check,
    )


# The dispatch above does host work (envelope, backend, PyPTO's launch and counting) that
# torch.compile cannot trace. Under compile the switched-on op is one opaque custom op
# whose body is that dispatch, so a captured step runs (and counts) it on every replay.


@torch.library.custom_op("pypto_moe::grouped_gemm", mutates_args=())
def _grouped_gemm_op(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: str,
    alpha: float,
    limit: float,
) -> torch.Tensor:
    return _eager(hidden_states, top_k_index, top_k_weights, gate_up, down, act, alpha, limit)


@_grouped_gemm_op.register_fake
def _(hidden_states, top_k_index, top_k_weights, gate_up, down, act, alpha, limit):
    return torch.empty_like(hidden_states)


def grouped_gemm(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: str = "silu",
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:
    """MoE experts for routed tokens in one PyPTO grouped GEMM (switch ``grouped_gemm``).

    Same contract as :func:`~.reference.grouped_gemm_reference`. Inside torch.compile a
    switched-on call is the opaque ``pypto_moe::grouped_gemm`` op; a switched-off one
    traces as the reference, so the graph stays pure torch.
    """
    _check_activation(act)
    if compiling():
        if not PACKAGE.switches.is_on("grouped_gemm"):
            return grouped_gemm_reference(
                hidden_states, top_k_index, top_k_weights, gate_up, down, act, alpha, limit
            )
        return _grouped_gemm_op(
            hidden_states,
            top_k_index,
            top_k_weights,
            gate_up,
            down,
            act,
            float(alpha),
            float(limit),
        )
    return _eager(hidden_states, top_k_index, top_k_weights, gate_up, down, act, alpha, limit)
