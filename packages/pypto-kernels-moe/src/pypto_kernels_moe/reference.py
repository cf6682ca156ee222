"""The torch reference of the grouped-GEMM experts, with the kernel's exact contract.

Why a gather (``index_select`` + ``bmm``) and not transformers' loop: the reference is
also the counted fallback inside a captured step, so it must have fixed shapes and no
host reads, like the kernel. The gather copies one expert slice per routed (token, slot)
row, so an eager call with many rows gathers a chunk of rows at a time
(:data:`MAX_GATHER_BYTES`); rows are independent, so chunking changes fp32 rounding at
most (bmm's blocking follows its batch size).
Contributions are added per token in ascending expert id,
in the hidden dtype, after ``(y * weight).to(dtype)``: the order and rounding of
transformers' ``index_add_`` loop, so greedy tokens match eager generation.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from pypto_kernels_common import compiling

__all__ = [
    "ACTIVATION_NAMES",
    "MAX_GATHER_BYTES",
    "ExpertMajorGrouping",
    "activate",
    "ascending_slots",
    "combine",
    "expert_major_grouping",
    "expert_major_reference",
    "gather_chunk",
    "grouped_gemm_reference",
]

#: What the kernel computes; the same names as :data:`.kernels.ACTIVATIONS`.
ACTIVATION_NAMES = ("silu", "gelu_tanh", "swigluoai")

#: The most bytes of gathered expert slices the reference holds at once. Why: unchunked,
#: a 512-token top-8 prefill of MiniMax-M2 (gate_up and down slices 27 MiB per row at
#: bf16) would gather 4096 rows, 108 GiB; the precision suite's fp32 golden of the
#: LLaDA2-mini prefill case held 4 GiB of gate_up slices at once. A decode step's rows fit
#: in one chunk, and a traced call is never chunked (:func:`gather_chunk`).
MAX_GATHER_BYTES = 256 * 2**20


def activate(h: torch.Tensor, act: str, alpha: float, limit: float) -> torch.Tensor:
    """``[.., 2I] -> [.., I]``: SwiGLU (``silu``), GeGLU (``gelu_tanh``) or MiniMax M3's
    clamped ``swigluoai``."""
    g, u = h.chunk(2, dim=-1)
    if act == "silu":
        return torch.nn.functional.silu(g) * u
    if act == "gelu_tanh":
        return torch.nn.functional.gelu(g, approximate="tanh") * u
    if act == "swigluoai":
        g = g.clamp(max=limit)
        u = u.clamp(min=-limit, max=limit)
        return (u + 1.0) * (g * torch.sigmoid(g * alpha))
    raise ValueError(f"unknown activation {act!r}; choose one of {', '.join(ACTIVATION_NAMES)}")


def ascending_slots(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's (ids, weights) reordered by ascending expert id, on the device.

    A slot's rank is how many of its token's experts have a smaller id (ids are distinct
    per token); scattering by rank sorts without ``argsort`` (which an NPU puts on AICPU
    for int64) and without any data-dependent shape.
    """
    if top_k_index.shape[-1] == 1:
        return top_k_index, top_k_weights
    rank = (top_k_index.unsqueeze(-1) > top_k_index.unsqueeze(-2)).sum(-1)
    ids = torch.empty_like(top_k_index).scatter_(-1, rank, top_k_index)
    weights = torch.empty_like(top_k_weights).scatter_(-1, rank, top_k_weights)
    return ids, weights


def gather_chunk(
    rows: int | torch.SymInt, gate_up: torch.Tensor, down: torch.Tensor, max_bytes: int
) -> int | None:
    """Rows per gather so one chunk's gate_up and down slices fit ``max_bytes``; None:
    gather every row at once (they fit, or the call is being traced: a captured step
    keeps one gather, whatever its token count). At least one row per chunk."""
    if compiling() or not isinstance(rows, int):
        return None
    per_row = (gate_up[0].numel() * gate_up.element_size()) + (
        down[0].numel() * down.element_size()
    )
    chunk = max(1, max_bytes // max(1, per_row))
    return None if rows <= chunk else chunk


def grouped_gemm_reference(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: str = "silu",
    alpha: float = 1.702,
    limit: float = 7.0,
    max_gather_bytes: int = MAX_GATHER_BYTES,
) -> torch.Tensor:
    """``out[t] = sum_j (w[t,j] * down[e] @ act(gate_up[e] @ x[t])).to(dtype)``, e = ids[t,j].

    ``hidden_states`` [T, H]; ``top_k_index``/``top_k_weights`` [T, k]; ``gate_up``
    [E, 2I, H] and ``down`` [E, H, I] (transformers' fused experts layout). At most
    ``max_gather_bytes`` of gathered expert slices are held at once (:func:`gather_chunk`).
    """
    t, h = hidden_states.shape
    k = top_k_index.shape[-1]
    ids, weights = ascending_slots(top_k_index, top_k_weights)
    flat = ids.reshape(-1)
    x = hidden_states.unsqueeze(1).expand(t, k, h).reshape(t * k, h)

    def rows(lo: int, hi: int | None) -> torch.Tensor:
        sel = flat[lo:hi]
        up = torch.bmm(gate_up.index_select(0, sel), x[lo:hi].unsqueeze(-1)).squeeze(-1)
        a = activate(up, act, alpha, limit)
        return torch.bmm(down.index_select(0, sel), a.unsqueeze(-1)).squeeze(-1)

    chunk = gather_chunk(t * k, gate_up, down, max_gather_bytes)
    if chunk is None:
        y = rows(0, None)
    else:
        y = torch.cat([rows(lo, lo + chunk) for lo in range(0, t * k, chunk)])
    contrib = (y * weights.reshape(-1, 1)).to(hidden_states.dtype).view(t, k, h)
    acc = contrib[:, 0]
    for j in range(1, k):
        acc = acc + contrib[:, j]
    return acc


class ExpertMajorGrouping(NamedTuple):
    """The routed rows grouped by expert, in fixed-size buffers.

    ``xs`` [P, H] and ``ws`` [P, 1] (fp32): P = padded tokens x k rows, expert e's rows at
    ``offsets[e] .. offsets[e + 1]`` (``offsets`` [E + 1] int32), padding tokens' rows
    after ``offsets[E]``. ``pos`` [P]: where each (token, slot) row went, to gather the
    results back per token.
    """

    xs: torch.Tensor
    ws: torch.Tensor
    offsets: torch.Tensor
    pos: torch.Tensor


def expert_major_grouping(
    hidden_states: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    experts: int,
    padded_tokens: int | None = None,
) -> ExpertMajorGrouping:
    """Group (token, slot) rows by expert on the device, with no routing-dependent shape.

    A sort-free count/offset pass: one-hot counts per expert, an exclusive cumsum for
    each expert's start, and each row's rank among its expert's rows (a cumsum down the
    one-hot), so ``pos = start[e] + rank`` is a stable counting sort (rows of one expert
    keep token order) without ``argsort`` or a host read. Tokens are padded to
    ``padded_tokens`` (the kernel's bucket) with rows routed to a dummy expert ``E``
    that sorts last and that the kernel never computes.
    """
    t = hidden_states.shape[0]
    k = ids.shape[1]
    b = t if padded_tokens is None else padded_tokens
    dev = hidden_states.device
    flat = torch.full((b * k,), experts, dtype=torch.long, device=dev)
    flat[: t * k] = ids.reshape(-1).long()
    w = torch.zeros(b * k, dtype=torch.float32, device=dev)
    w[: t * k] = weights.reshape(-1).float()
    onehot = torch.nn.functional.one_hot(flat, experts + 1).int()
    counts = onehot.sum(0)
    ends = counts.cumsum(0)
    starts = ends - counts
    rank = (onehot.cumsum(0) - onehot).gather(1, flat.unsqueeze(1)).squeeze(1)
    pos = starts.index_select(0, flat) + rank
    rows = torch.arange(b * k, device=dev)
    perm = torch.empty_like(rows).scatter_(0, pos.long(), rows)
    src = perm // k
    # padding rows (src >= t) read token t - 1 and are zeroed: no routing-dependent shape
    gathered = hidden_states.index_select(0, src.clamp(max=t - 1))
    xs = torch.where((src < t).unsqueeze(1), gathered, torch.zeros_like(gathered))
    offsets = torch.cat([torch.zeros_like(ends[:1]), ends[:experts]]).to(torch.int32)
    return ExpertMajorGrouping(xs, w.index_select(0, perm).unsqueeze(1), offsets, pos.long())


def combine(ys: torch.Tensor, pos: torch.Tensor, tokens: int, k: int) -> torch.Tensor:
    """Per-token sum of the weighted expert rows, slots in ascending expert id (the
    decode kernel's and transformers' order, so fp32 tokens match)."""
    contrib = ys.index_select(0, pos).view(-1, k, ys.shape[1])[:tokens]
    acc = contrib[:, 0]
    for j in range(1, k):
        acc = acc + contrib[:, j]
    return acc


def expert_major_reference(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: str = "silu",
    alpha: float = 1.702,
    limit: float = 7.0,
    padded_tokens: int | None = None,
) -> torch.Tensor:
    """The expert-major kernel's algorithm in torch (grouping, one GEMM per expert over
    its rows, weighted, gathered back, summed in ascending expert id): the same contract
    as :func:`grouped_gemm_reference`. It reads the offsets on the host (a test oracle
    for the grouping, not a capture-safe fallback)."""
    t = hidden_states.shape[0]
    k = top_k_index.shape[1]
    e = gate_up.shape[0]
    ids, weights = ascending_slots(top_k_index, top_k_weights)
    g = expert_major_grouping(hidden_states, ids, weights, e, padded_tokens)
    ys = torch.zeros_like(g.xs)
    bounds = g.offsets.tolist()
    for x in range(e):
        lo, hi = bounds[x], bounds[x + 1]
        if hi == lo:
            continue
        up = g.xs[lo:hi] @ gate_up[x].T
        y = activate(up, act, alpha, limit) @ down[x].T
        ys[lo:hi] = (y * g.ws[lo:hi]).to(hidden_states.dtype)
    return combine(ys, g.pos, t, k)
