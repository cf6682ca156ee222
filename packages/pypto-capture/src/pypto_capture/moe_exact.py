"""Exact, capture-safe MoE for transformers' expert modules, and the static proxy.

Why: transformers' eager experts forward (``one_hot -> nonzero -> loop over the hit
experts -> index_add_``) is data-dependent. Under torch.compile it is a graph break
(``nonzero`` has a data-dependent shape); on an NPU the seed's sort-based routing put
``argsort(int64)``/``bincount`` on AICPU (ACL 107027), rebuilt the expert cumsum inside
the captured region (507011) and fed a grouped GEMM growing shapes (507015). The seed
worked around it with :class:`~pypto_capture.StaticMoERouting`, which sends every token
to fixed experts: it captures, but the outputs are not the model's.

What :func:`apply_exact_moe` installs instead keeps the router exactly as the model has
it (its top-k runs on the device; nothing is read back) and replaces only the experts'
forward, per call shape:

* decode-shaped calls (``tokens * top_k < num_experts``): **gather**. The k selected
  experts' weights are gathered with ``index_select`` and applied with a batched matmul
  (``bmm``), so a step reads the selected experts only, never all of them: the bytes a
  fused grouped GEMM would read. Under inductor on CPU the gather and the batched
  matrix-vector product fuse into one kernel that reads each selected row once; under
  CUDA/NPU graph capture the gathered copy is materialised (3x the active bytes, still a
  fraction of all experts).
* larger calls while a graph is being captured or compiled (prefill): **dense-masked**.
  Every expert runs on every token and a device-side mask keeps only the routed
  contributions: fixed shapes, no sort, no counts, no cumsum; it costs
  ``num_experts / top_k`` times the routed expert FLOPs.
* larger calls in eager mode: the model's own forward (already exact; the cheapest).

Both fixed-shape paths add each token's expert contributions in ascending expert order,
in the hidden dtype, after weighting exactly as transformers does
(``(out * weight).to(dtype)``), so the sums happen in the same order as the native
``index_add_`` loop: greedy tokens equal eager ``generate``.

:func:`apply_static_moe` installs the seed's static routing as an explicit throughput
proxy (``--moe-routing static`` in pypto-bench): every token goes to fixed, round-robin
experts (tokens 0..B-1 of a decode step: experts ``t*k .. t*k+k-1``) with routing tables
built before capture. Its outputs differ from the model's by design.

Both return a :class:`MoEHandle` whose ``undo()`` restores the model's own forward.
"""

from __future__ import annotations

import inspect
import logging
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import PyptoCaptureError, UnsupportedModelError
from .moe import StaticMoERouting

log = logging.getLogger(__name__)

__all__ = [
    "MOE_ROUTINGS",
    "ExpertsInfo",
    "MoEHandle",
    "apply_exact_moe",
    "apply_moe_routing",
    "apply_static_moe",
    "exact_experts_forward",
    "find_experts",
    "moe_weight_bytes",
]

#: Routing modes a caller may ask for (pypto-bench's ``--moe-routing``).
MOE_ROUTINGS = ("exact", "static")

_MARK = "_pypto_moe_routing"


# --- discovery --------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpertsInfo:
    """One experts module: where it is and what one expert's weights weigh."""

    name: str
    num_experts: int
    top_k: int | None
    bytes_per_expert: int


def _param3d(module: torch.nn.Module, name: str) -> torch.Tensor | None:
    value = getattr(module, name, None)
    return value if isinstance(value, torch.Tensor) and value.dim() == 3 else None


def _routed_call(module: torch.nn.Module) -> bool:
    """Its forward is called as the routed experts are: ``(hidden_states, top_k_index,
    top_k_weights)``, three required positional parameters, read off its signature.

    Why: the layout alone also matches shared experts kept as 3-D stacks (Inkling's
    ``InklingSharedExperts.forward(hidden_states, gammas)``), whose forward, replaced,
    refused the router's ``gammas`` keyword and crashed the graph arm."""
    try:
        params = list(inspect.signature(type(module).forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    required = [
        p for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]  # fmt: skip
    return len(required) == 3


def _is_experts(module: torch.nn.Module) -> bool:
    """transformers' fused (routed) experts: 3-D ``down_proj`` and 3-D ``gate_up_proj`` (or
    ``up_proj`` for ungated experts), one slice per expert, called with the router's
    choice (:func:`_routed_call`)."""
    down = _param3d(module, "down_proj")
    up = _param3d(module, "gate_up_proj")
    if up is None:
        up = _param3d(module, "up_proj")
    if down is None or up is None or down.shape[0] != up.shape[0]:
        return False
    return _routed_call(module)


def _up_weight(module: torch.nn.Module) -> torch.Tensor:
    gate_up = _param3d(module, "gate_up_proj")
    if getattr(module, "has_gate", True) and gate_up is not None:
        return gate_up
    up = _param3d(module, "up_proj")
    if up is None:
        raise PyptoCaptureError(f"{type(module).__name__} has no 3-D gate_up_proj or up_proj")
    return up


def _down_weight(module: torch.nn.Module) -> torch.Tensor:
    down = _param3d(module, "down_proj")
    if down is None:
        raise PyptoCaptureError(f"{type(module).__name__} has no 3-D down_proj")
    return down


def _top_k_of(model: torch.nn.Module, parent: torch.nn.Module | None) -> int | None:
    for obj in (parent, getattr(parent, "gate", None), getattr(parent, "router", None)):
        k = getattr(obj, "top_k", None) if obj is not None else None
        if isinstance(k, int) and k > 0:
            return k
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    k = getattr(config, "num_experts_per_tok", None)
    return k if isinstance(k, int) and k > 0 else None


def _iter_experts(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module, int | None]]:
    parents: dict[str, torch.nn.Module] = dict(model.named_modules())
    for name, module in model.named_modules():
        if _is_experts(module):
            parent = parents.get(name.rsplit(".", 1)[0]) if "." in name else model
            yield name, module, _top_k_of(model, parent)


def swap_forward(module: Any, fn: Any, mark: str, value: Any = True) -> Any:
    """Bind ``fn`` as ``module``'s instance ``forward`` and set attribute ``mark``; return
    the callable that puts back exactly what was there (an instance forward or none).

    The one way the project swaps a module's forward (exact/static MoE here, kernel
    plug-ins elsewhere), so every swap undoes the same way.
    """
    had_own = "forward" in vars(module)
    previous = vars(module).get("forward")
    module.forward = types.MethodType(fn, module)
    setattr(module, mark, value)

    def restore() -> None:
        if had_own:
            module.forward = previous
        else:
            vars(module).pop("forward", None)
        vars(module).pop(mark, None)

    return restore


def find_experts(model: torch.nn.Module) -> list[ExpertsInfo]:
    """Every fused experts module of ``model`` (empty for a dense model)."""
    out = []
    for name, module, k in _iter_experts(model):
        up, down = _up_weight(module), _down_weight(module)
        per = (up[0].numel() * up.element_size()) + (down[0].numel() * down.element_size())
        for bias in ("gate_up_proj_bias", "up_proj_bias", "down_proj_bias"):
            b = getattr(module, bias, None)
            if isinstance(b, torch.Tensor) and b.dim() == 2:
                per += int(b.shape[1]) * b.element_size()
        out.append(ExpertsInfo(name, int(down.shape[0]), k, int(per)))
    return out


def moe_weight_bytes(model: torch.nn.Module, batch: int = 1) -> dict[str, int] | None:
    """Bytes of expert weights in ``model``, and how many a decode step of ``batch`` reads.

    ``active_bytes`` counts at most ``min(num_experts, batch * top_k)`` experts per MoE
    layer: exact for batch 1 (k distinct experts per token), an upper bound for larger
    batches (rows may share experts). None for a model without fused experts.
    """
    infos = find_experts(model)
    if not infos:
        return None
    total = sum(i.num_experts * i.bytes_per_expert for i in infos)
    active = 0
    for i in infos:
        k = i.top_k if i.top_k is not None else i.num_experts
        active += min(i.num_experts, max(1, batch) * k) * i.bytes_per_expert
    return {"expert_bytes": total, "active_expert_bytes": active, "moe_layers": len(infos)}


# --- the exact forward ------------------------------------------------------------------


def _capturing() -> bool:
    """True while torch.compile traces or a CUDA/NPU stream is being captured."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and compiler.is_compiling():
        return True
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return True
    npu = getattr(torch, "npu", None)
    probe = getattr(npu, "is_current_stream_capturing", None)
    if callable(probe):
        try:
            return bool(probe())
        except Exception:  # no NPU initialised: not capturing
            return False
    return False


def _linear(x: torch.Tensor, weight: torch.Tensor, transposed: bool) -> torch.Tensor:
    """x [N, in] times one expert's weight ([out, in], or [in, out] when transposed)."""
    return x @ weight if transposed else torch.nn.functional.linear(x, weight)


def _bmm(x: torch.Tensor, weights: torch.Tensor, transposed: bool) -> torch.Tensor:
    """Row s of x [S, in] times weights[s] ([S, out, in], or [S, in, out] transposed)."""
    if transposed:
        return torch.bmm(x.unsqueeze(1), weights).squeeze(1)
    return torch.bmm(weights, x.unsqueeze(-1)).squeeze(-1)


def _activate(module: Any, h: torch.Tensor) -> torch.Tensor:
    if getattr(module, "has_gate", True):
        gate = getattr(module, "_apply_gate", None)
        if callable(gate):
            return gate(h)
        g, u = h.chunk(2, dim=-1)
        return module.act_fn(g) * u
    return module.act_fn(h)


def _bias(module: Any, which: str) -> torch.Tensor | None:
    if not getattr(module, "has_bias", False):
        return None
    name = (
        "down_proj_bias"
        if which == "down"
        else ("gate_up_proj_bias" if getattr(module, "has_gate", True) else "up_proj_bias")
    )
    b = getattr(module, name, None)
    return b if isinstance(b, torch.Tensor) else None


def _post_norm(module: Any, y: torch.Tensor) -> torch.Tensor:
    if getattr(module, "has_post_expert_norm", False):
        return module.post_expert_norm(y)
    return y


def _in_expert_order(contrib: torch.Tensor, top_k_index: torch.Tensor) -> torch.Tensor:
    """[T, k, H] contributions summed per token in ascending expert id, one add at a time.

    The native loop adds expert e's contribution to ``zeros`` for e = 0, 1, ...; a slot's
    rank among its token's k experts is the number of the token's experts with a smaller
    id (ids are distinct per token), so scattering by rank and adding left to right
    reproduces that order (``0 + c`` is exact). No sort: a [T, k, k] comparison.
    """
    t, k, h = contrib.shape
    if k == 1:
        return contrib[:, 0]
    rank = (top_k_index.unsqueeze(-1) > top_k_index.unsqueeze(-2)).sum(-1)  # [T, k]
    ordered = torch.zeros_like(contrib).scatter_(1, rank.unsqueeze(-1).expand(t, k, h), contrib)
    acc = ordered[:, 0]
    for j in range(1, k):
        acc = acc + ordered[:, j]
    return acc


def _gather_forward(
    module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    t, h = hidden.shape
    k = top_k_index.shape[-1]
    transposed = bool(getattr(module, "is_transposed", False))
    ids = top_k_index.reshape(-1)
    x = hidden.unsqueeze(1).expand(t, k, h).reshape(t * k, h)
    up = _bmm(x, _up_weight(module).index_select(0, ids), transposed)
    b = _bias(module, "up")
    if b is not None:
        up = up + b.index_select(0, ids)
    act = _activate(module, up)
    y = _bmm(act, _down_weight(module).index_select(0, ids), transposed)
    b = _bias(module, "down")
    if b is not None:
        y = y + b.index_select(0, ids)
    y = _post_norm(module, y)
    contrib = (y * top_k_weights.reshape(-1, 1)).to(hidden.dtype).view(t, k, h)
    return _in_expert_order(contrib, top_k_index)


def _dense_forward(
    module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    transposed = bool(getattr(module, "is_transposed", False))
    up_w, down_w = _up_weight(module), _down_weight(module)
    up_b, down_b = _bias(module, "up"), _bias(module, "down")
    acc = torch.zeros_like(hidden)
    zero = torch.zeros((), dtype=hidden.dtype, device=hidden.device)
    for e in range(int(down_w.shape[0])):  # a static loop: fixed shapes, views, no host reads
        sel = top_k_index == e  # [T, k]
        hit = sel.any(-1, keepdim=True)  # [T, 1]
        w = torch.where(sel, top_k_weights, torch.zeros_like(top_k_weights)).sum(-1, keepdim=True)
        up = _linear(hidden, up_w[e], transposed)
        if up_b is not None:
            up = up + up_b[e]
        y = _linear(_activate(module, up), down_w[e], transposed)
        if down_b is not None:
            y = y + down_b[e]
        y = _post_norm(module, y)
        acc = acc + torch.where(hit, (y * w).to(hidden.dtype), zero)
    return acc


def exact_experts_forward(
    module: Any,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    native: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """The experts' output for routed tokens: exact, and capture-safe (module docstring).

    ``hidden_states`` [T, H]; ``top_k_index`` [T, k] (distinct expert ids per token);
    ``top_k_weights`` [T, k]. ``native`` is the module's own forward, used for large
    eager calls; without it those use the dense-masked scheme too.
    """
    if hidden_states.dim() != 2 or top_k_index.shape != top_k_weights.shape:
        raise PyptoCaptureError(
            "experts expect hidden_states [tokens, hidden] and top_k_index/top_k_weights "
            f"[tokens, k]; got {tuple(hidden_states.shape)}, {tuple(top_k_index.shape)}, "
            f"{tuple(top_k_weights.shape)}"
        )
    t, k = top_k_index.shape
    num_experts = int(_down_weight(module).shape[0])
    if t * k < num_experts:
        return _gather_forward(module, hidden_states, top_k_index, top_k_weights)
    if native is not None and not _capturing():
        return native(hidden_states, top_k_index, top_k_weights)
    return _dense_forward(module, hidden_states, top_k_index, top_k_weights)


# --- the static proxy -------------------------------------------------------------------


class _StaticTables:
    """Round-robin ``StaticMoERouting`` tables per (tokens, k, experts, device).

    Built eagerly: the tables need host work (``bincount``, ``argsort``, ``.cpu()``) that
    must not run inside a captured region. ``prebuild`` makes them for the shapes a
    capture will see; an eager call builds missing ones on first use.
    """

    def __init__(self) -> None:
        self.tables: dict[tuple[int, int, int, str], StaticMoERouting] = {}

    def get(self, t: int, k: int, e: int, device: torch.device) -> StaticMoERouting:
        key = (t, k, e, str(device))
        routing = self.tables.get(key)
        if routing is None:
            if _capturing():
                raise PyptoCaptureError(
                    f"static MoE routing tables for {t} tokens were not built before capture; "
                    f"pass token_counts=({t},) to apply_static_moe"
                )
            routing = StaticMoERouting.round_robin(t, k, e, device=device)
            self.tables[key] = routing
        return routing


def _static_forward(
    tables: _StaticTables,
    module: Any,
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    t = hidden.shape[0]
    k = top_k_index.shape[-1]
    transposed = bool(getattr(module, "is_transposed", False))
    up_w, down_w = _up_weight(module), _down_weight(module)
    routing = tables.get(t, k, int(down_w.shape[0]), hidden.device)
    grouped = routing.dispatch(hidden)
    outs = []
    for e in range(int(down_w.shape[0])):
        lo, hi = routing.host_offsets[e], routing.host_offsets[e + 1]
        if hi > lo:  # host ints fixed before capture: static slice bounds, weight views
            y = _linear(
                _activate(module, _linear(grouped[lo:hi], up_w[e], transposed)),
                down_w[e],
                transposed,
            )
            outs.append(_post_norm(module, y))
    # The router's weights for its own choice mix the fixed experts: real arithmetic per token.
    out = routing.combine(torch.cat(outs, 0), top_k_weights.to(hidden.dtype))
    return out.to(hidden.dtype)


# --- install / undo ---------------------------------------------------------------------


@dataclass
class MoEHandle:
    """What ``apply_exact_moe`` / ``apply_static_moe`` changed; ``undo()`` restores it.

    ``modules`` names the experts modules whose forward was replaced (empty: the model
    has no fused experts and nothing changed). Usable as a context manager.
    """

    routing: str
    modules: list[str] = field(default_factory=list)
    _restore: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @property
    def applied(self) -> bool:
        return bool(self.modules)

    def undo(self) -> None:
        while self._restore:
            self._restore.pop()()
        self.modules = []

    def __enter__(self) -> MoEHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()

    def to_dict(self) -> dict[str, Any]:
        return {"routing": self.routing, "modules": len(self.modules)}


def _install(
    model: torch.nn.Module,
    routing: str,
    make_forward: Callable[[Any, Callable[..., torch.Tensor]], Callable[..., torch.Tensor]],
) -> MoEHandle:
    handle = MoEHandle(routing)
    targets = [(name, module) for name, module, _ in _iter_experts(model)]
    for name, module in targets:
        current = getattr(module, _MARK, None)
        if current is not None:
            handle.undo()
            raise PyptoCaptureError(
                f"{name} already runs {current} MoE routing; undo that handle before applying {routing}"
            )
    for name, module in targets:
        native = module.forward  # the class's forward (or one already set on the instance)
        handle._restore.append(swap_forward(module, make_forward(module, native), _MARK, routing))
        handle.modules.append(name)
    if handle.modules:
        log.info("%s MoE routing installed on %d experts modules", routing, len(handle.modules))
    return handle


def _unapplied_parts(module: torch.nn.Module) -> list[str]:
    """Child modules of an experts module that hold weights the exact forward does not
    apply (it applies the 3-D projections, their biases and activation, and a
    ``post_expert_norm`` only where ``has_post_expert_norm`` says so)."""
    applied = {"post_expert_norm"} if getattr(module, "has_post_expert_norm", False) else set()
    return [
        name
        for name, child in module.named_children()
        if name not in applied and next(child.parameters(), None) is not None
    ]


def apply_exact_moe(model: torch.nn.Module) -> MoEHandle:
    """Replace every fused experts module's forward by :func:`exact_experts_forward`.

    The router is untouched. Whatever the router hands the experts beyond the routed
    triple ``(hidden_states, top_k_index, top_k_weights)`` (a keyword some family adds)
    has the module's own meaning, so such a call goes to the module's own forward (it
    once raised "unexpected keyword argument" in the graph arm). Returns a handle whose ``undo()`` restores the model's own
    forward; a model without fused experts comes back with an empty handle.
    """

    def make(module: Any, native: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def forward(
            self: Any,
            hidden_states: torch.Tensor,
            top_k_index: torch.Tensor,
            top_k_weights: torch.Tensor,
            *args: Any,
            **kwargs: Any,
        ) -> torch.Tensor:
            if args or kwargs:
                return native(hidden_states, top_k_index, top_k_weights, *args, **kwargs)
            return exact_experts_forward(self, hidden_states, top_k_index, top_k_weights, native)

        return forward

    for name, module, _ in _iter_experts(model):
        parts = _unapplied_parts(module)
        if parts:
            # Ergo's experts normalise each route with a learned per-expert RMSNorm inside
            # their own forward: replaced, the graph arm silently dropped it (KL 0.1).
            raise UnsupportedModelError(
                f"{name} ({type(module).__name__}) carries {', '.join(parts)} with weights of "
                "its own, which pypto-capture's exact MoE does not apply: its graph arm would "
                "compute something else; run the eager arm (or --moe-routing static, a proxy)"
            )
    return _install(model, "exact", make)


def apply_static_moe(model: torch.nn.Module, token_counts: Iterable[int] = ()) -> MoEHandle:
    """Install the seed's static round-robin routing (a throughput proxy; see the module
    docstring). ``token_counts``: the token counts a capture will see (decode: the batch
    size), whose routing tables are built now, before capture."""
    tables = _StaticTables()
    infos = {i.name: i for i in find_experts(model)}
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    for name, info in infos.items():
        k = info.top_k
        if k is None:
            raise PyptoCaptureError(
                f"{name}: cannot tell how many experts a token uses (no top_k on the MoE block "
                "and no num_experts_per_tok in the config)"
            )
        for t in token_counts:
            tables.get(int(t), k, info.num_experts, device)

    def make(module: Any, native: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def forward(
            self: Any,
            hidden_states: torch.Tensor,
            top_k_index: torch.Tensor,
            top_k_weights: torch.Tensor,
            *args: Any,
            **kwargs: Any,
        ) -> torch.Tensor:
            if args or kwargs:
                return native(hidden_states, top_k_index, top_k_weights, *args, **kwargs)
            return _static_forward(tables, self, hidden_states, top_k_index, top_k_weights)

        return forward

    return _install(model, "static", make)


def apply_moe_routing(
    model: torch.nn.Module, routing: str, *, token_counts: Iterable[int] = ()
) -> MoEHandle:
    """``apply_exact_moe`` or ``apply_static_moe`` by name (``MOE_ROUTINGS``)."""
    if routing == "exact":
        return apply_exact_moe(model)
    if routing == "static":
        return apply_static_moe(model, token_counts)
    raise PyptoCaptureError(
        f"unknown MoE routing {routing!r}; choose one of {', '.join(MOE_ROUTINGS)}"
    )
