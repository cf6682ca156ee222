"""The ``pypto.kernels`` plug-in: Gated DeltaNet and KDA decode steps through the step ops.

Why a decode-step forward per layer and not a swap of transformers' recurrent function:
the fused kernel also takes the layer's gate inputs and its gated RMSNorm, which live in
the layer's forward, not in ``torch_recurrent_gated_delta_rule``; and the recurrent
function is a module-level name shared by every layer of the process. So the plug-in
gives each fitting layer an instance ``forward`` that, on a one-token step with a cache
holding the layer's conv and recurrent states (transformers' decode branch), runs the
layer's own projections and causal-conv update, the step op (state updated in place in
the cache's own tensor, as transformers' ``update_recurrent_state`` copies into it), and
the layer's output projection; any other call (prefill, no cache, a cache recording its
past) goes to the forward the layer had, untouched.

Layers are recognised by what they hold, not by class name, so Qwen3-Next, Qwen3.5 /
Qwen3.6 (dense and MoE) and Kimi-Linear layers fit, as would a new model reusing them:
a Gated DeltaNet layer (``A_log``, ``dt_bias``, a SiLU-gated ``norm``, ``conv1d``,
``out_proj`` and either ``in_proj_qkvz`` + ``in_proj_ba`` or ``in_proj_qkv`` /
``in_proj_z`` / ``in_proj_b`` / ``in_proj_a``) or a KDA layer (``forget_gate``,
``b_proj``, ``g_a_proj`` / ``g_b_proj``, a sigmoid-gated ``o_norm``, ``q/k/v_proj``,
``conv1d``, ``o_proj``). The conv update and padding mask are the layer's modeling
module's own functions.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pypto_capture import swap_forward

from .ops import gated_delta_step, kda_step
from .package import PACKAGE

log = logging.getLogger("pypto_kernels_linear_attention")

__all__ = ["KINDS", "PLUGIN", "LinearAttentionPlugin", "fitting_layers", "layer_kind"]

_MARK = "_pypto_kernels_linear_attention"
#: ``qkvz``: Qwen3-Next's fused projections; ``qkv``: Qwen3.5 / 3.6's split ones; ``kda``.
KINDS = ("qkvz", "qkv", "kda")
_GDN = ("A_log", "dt_bias", "norm", "conv1d", "out_proj", "num_k_heads", "num_v_heads")
_KDA = ("forget_gate", "b_proj", "g_a_proj", "g_b_proj", "o_norm", "q_proj", "k_proj", "v_proj")


def _has(module: Any, names: tuple[str, ...]) -> bool:
    return all(hasattr(module, n) for n in names)


def _gated_norm(norm: Any, activations: tuple[str, ...], default: str | None) -> bool:
    """A gated RMSNorm whose gate activation is one of ``activations``. transformers
    5.8's Qwen3-Next / Qwen3.5 norms have no ``activation`` attribute (SiLU is written in
    their forward): ``default`` stands for it."""
    weight = getattr(norm, "weight", None)
    activation = getattr(norm, "activation", default)
    return (
        isinstance(weight, torch.Tensor)
        and type(norm).__name__.endswith("RMSNormGated")
        and activation in activations
        and isinstance(getattr(norm, "variance_epsilon", None), float)
    )


def _functions(module: torch.nn.Module) -> dict[str, Callable[..., Any]] | None:
    """The layer's own conv update (an instance attribute in transformers 5.8, a function
    of its modeling module later) and its modeling module's padding mask, or None."""
    mod = sys.modules.get(type(module).__module__)
    conv = getattr(module, "causal_conv1d_update", None)
    if not callable(conv):
        conv = getattr(mod, "causal_conv1d_update", None)
    if not callable(conv):
        return None
    return {"conv": conv, "mask": getattr(mod, "apply_mask_to_padding_states", None)}


def layer_kind(module: torch.nn.Module) -> str | None:
    """``qkvz`` / ``qkv`` (Gated DeltaNet) or ``kda`` when the step op can run this layer."""
    if (
        not isinstance(getattr(module, "conv1d", None), torch.nn.Conv1d)
        or _functions(module) is None
    ):
        return None
    if _has(module, _GDN) and _gated_norm(module.norm, ("silu", "swish"), "silu"):
        if _has(module, ("in_proj_qkvz", "in_proj_ba", "fix_query_key_value_ordering")):
            return "qkvz"
        if _has(module, ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")):
            return "qkv"
        return None
    if _has(module, (*_KDA, "o_proj", "head_dim", "num_heads")) and _gated_norm(
        module.o_norm, ("sigmoid",), None
    ):
        gate = module.forget_gate
        if _has(gate, ("f_a_proj", "f_b_proj", "dt_bias", "A_log")):
            return "kda"
    return None


def fitting_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, str]]:
    """(name, layer, kind) for every linear-attention layer the step ops can run."""
    out = []
    for name, module in model.named_modules():
        kind = layer_kind(module)
        if kind is not None:
            out.append((name, module, kind))
    return out


def _decode_states(module: Any, hidden_states: torch.Tensor, cache: Any) -> tuple[Any, Any] | None:
    """(conv_state, recurrent_state) when this call is transformers' one-token decode
    branch of the layer, else None (the layer's own forward runs).

    Two cache APIs: ``get_conv_state`` / ``get_recurrent_state`` (and
    ``is_recording_past``) in recent 5.x; ``has_previous_state(layer_idx)`` and the
    layer's ``conv_states`` / ``recurrent_states`` tensors in 5.8.
    """
    if cache is None or hidden_states.dim() != 3 or hidden_states.shape[1] != 1:
        return None
    idx = module.layer_idx
    if hasattr(cache, "get_conv_state") and hasattr(cache, "get_recurrent_state"):
        recording = getattr(cache, "is_recording_past", None)
        if callable(recording) and recording(idx):
            return None
        conv = cache.get_conv_state(idx, state_idx=0)
        rec = cache.get_recurrent_state(idx, state_idx=0)
    else:
        has_previous = getattr(cache, "has_previous_state", None)
        layers = getattr(cache, "layers", None)
        if not callable(has_previous) or layers is None or not has_previous(idx):
            return None
        conv = getattr(layers[idx], "conv_states", None)
        rec = getattr(layers[idx], "recurrent_states", None)
    if not (isinstance(conv, torch.Tensor) and isinstance(rec, torch.Tensor)):
        return None
    return conv, rec


def _conv(
    module: Any, fns: dict[str, Any], mixed: torch.Tensor, conv_state: torch.Tensor
) -> torch.Tensor:
    out = fns["conv"](
        mixed.transpose(1, 2),
        conv_state,
        module.conv1d.weight.squeeze(1),
        module.conv1d.bias,
        module.activation,
    )
    return out.transpose(1, 2)


def _gated_delta(
    module: Any,
    kind: str,
    fns: dict[str, Any],
    x: torch.Tensor,
    conv_state: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    bsz = x.shape[0]
    hk, hv, dk, dv = module.num_k_heads, module.num_v_heads, module.head_k_dim, module.head_v_dim
    if kind == "qkvz":
        query, key, value, z, b, a = module.fix_query_key_value_ordering(
            module.in_proj_qkvz(x), module.in_proj_ba(x)
        )
        mixed = torch.cat([t.reshape(bsz, 1, -1) for t in (query, key, value)], dim=-1)
    else:
        mixed = module.in_proj_qkv(x)
        z, b, a = module.in_proj_z(x), module.in_proj_b(x), module.in_proj_a(x)
    mixed = _conv(module, fns, mixed, conv_state)
    q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv], dim=-1)
    out = gated_delta_step(
        q.reshape(bsz, hk, dk),
        k.reshape(bsz, hk, dk),
        v.reshape(bsz, hv, dv),
        a.reshape(bsz, hv),
        b.reshape(bsz, hv),
        z.reshape(bsz, hv, dv),
        module.A_log,
        module.dt_bias,
        module.norm.weight,
        state,
        module.norm.variance_epsilon,
    )
    return module.out_proj(out.reshape(bsz, 1, hv * dv))


def _kda(
    module: Any, fns: dict[str, Any], x: torch.Tensor, conv_state: torch.Tensor, state: torch.Tensor
) -> torch.Tensor:
    bsz = x.shape[0]
    heads, dim = module.num_heads, module.head_dim
    mixed = torch.cat([module.q_proj(x), module.k_proj(x), module.v_proj(x)], dim=-1)
    mixed = _conv(module, fns, mixed, conv_state)
    q, k, v = (t.reshape(bsz, heads, dim) for t in torch.split(mixed, [heads * dim] * 3, dim=-1))
    fg = module.forget_gate
    out = kda_step(
        q,
        k,
        v,
        fg.f_b_proj(fg.f_a_proj(x)).reshape(bsz, heads, dim),
        module.b_proj(x).reshape(bsz, heads),
        module.g_b_proj(module.g_a_proj(x)).reshape(bsz, heads, dim),
        fg.A_log,
        fg.dt_bias,
        module.o_norm.weight,
        state,
        module.o_norm.variance_epsilon,
    )
    return module.o_proj(out.reshape(bsz, 1, heads * dim))


def _step_forward(
    kind: str, previous: Callable[..., Any], fns: dict[str, Any]
) -> Callable[..., Any]:
    def forward(self: Any, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        # transformers renamed cache_params to cache (5.x); take either, by keyword or place.
        if args:
            cache, mask = args[0], (args[1] if len(args) > 1 else kwargs.get("attention_mask"))
        else:
            cache = kwargs.get("cache", kwargs.get("cache_params"))
            mask = kwargs.get("attention_mask")
        states = _decode_states(self, hidden_states, cache)
        if states is None:
            return previous(hidden_states, *args, **kwargs)
        if mask is not None and fns["mask"] is not None:
            hidden_states = fns["mask"](hidden_states, mask)
        if kind == "kda":
            return _kda(self, fns, hidden_states, *states)
        return _gated_delta(self, kind, fns, hidden_states, *states)

    return forward


class LinearAttentionPlugin:
    """Applies to any model with Gated DeltaNet or KDA layers the step ops can run."""

    name = "linear_attention"

    def applies_to(self, model: torch.nn.Module) -> bool:
        return bool(fitting_layers(model))

    @contextlib.contextmanager
    def enable(self, model: torch.nn.Module) -> Iterator[None]:
        targets = fitting_layers(model)
        if not targets:
            raise ValueError(
                f"{type(model).__name__} has no Gated DeltaNet or KDA layer the step kernels can run"
            )
        PACKAGE.stats.reset()  # report() covers this enable(): one arm's calls
        restore = []
        try:
            for name, module, kind in targets:
                if getattr(module, _MARK, False):
                    raise ValueError(
                        f"{name} already runs the step kernel; leave that enable() first"
                    )
                fns = _functions(module)
                assert fns is not None  # layer_kind checked it
                restore.append(
                    swap_forward(module, _step_forward(kind, module.forward, fns), _MARK)
                )
            kinds = sorted({kind for _, _, kind in targets})
            log.info(
                "linear-attention step kernels on %d layers (%s)", len(restore), ", ".join(kinds)
            )
            with PACKAGE.switches.pto_switches(gated_delta_step=True, kda_step=True):
                yield
        finally:
            while restore:
                restore.pop()()

    def report(self) -> dict[str, Any]:
        return PACKAGE.report()


PLUGIN = LinearAttentionPlugin()
