"""The ``pypto.kernels`` plug-in: fused experts through the grouped-GEMM op.

Why it wraps the experts module's *current* forward instead of calling
``pypto_capture.apply_exact_moe`` itself: pypto-bench's graph arms install the exact
capture-safe MoE first and then enter every plug-in's ``enable``; a second install would
be refused (one routing per module). Wrapping whatever forward is current works inside
the bench and on a bare model alike, and ``enable``'s exit restores exactly that
forward. Modules the kernel cannot express (ungated, biased, transposed, post-expert
norm, an activation other than SiLU, GELU-tanh or ``swigluoai``) keep their forward untouched.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from pypto_capture import swap_forward

from .ops import grouped_gemm
from .package import PACKAGE

log = logging.getLogger("pypto_kernels_moe")

__all__ = ["PLUGIN", "MoEKernelPlugin", "activation_of", "fitting_experts"]

_MARK = "_pypto_kernels_moe"


def _is_silu(act: Any) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")


def _is_gelu_tanh(act: Any) -> bool:
    if isinstance(act, torch.nn.GELU):
        return act.approximate == "tanh"
    return type(act).__name__ in ("GELUTanh", "PytorchGELUTanh")


def activation_of(module: torch.nn.Module) -> tuple[str, float, float] | None:
    """(activation, alpha, limit) the kernel computes for this experts module, or None."""
    down, gate_up = getattr(module, "down_proj", None), getattr(module, "gate_up_proj", None)
    if not (isinstance(down, torch.Tensor) and isinstance(gate_up, torch.Tensor)):
        return None
    if down.dim() != 3 or gate_up.dim() != 3 or not getattr(module, "has_gate", True):
        return None
    if getattr(module, "has_bias", False) or getattr(module, "is_transposed", False):
        return None
    if getattr(module, "has_post_expert_norm", False):
        return None
    limit, alpha = getattr(module, "swiglu_limit", None), getattr(module, "swiglu_alpha", None)
    # transformers' experts decorator gives every experts class a default _apply_gate
    # (act_fn(gate) * up); only a class's own one (MiniMax M3's clamp) changes the math.
    gate = getattr(type(module), "_apply_gate", None)
    if gate is not None and getattr(gate, "__name__", "") != "_default_apply_gate":
        if isinstance(limit, (int, float)) and isinstance(alpha, (int, float)):
            return "swigluoai", float(alpha), float(limit)
        return None
    if _is_silu(getattr(module, "act_fn", None)):
        return "silu", 1.702, 7.0
    if _is_gelu_tanh(getattr(module, "act_fn", None)):
        return "gelu_tanh", 1.702, 7.0
    return None


def fitting_experts(
    model: torch.nn.Module,
) -> list[tuple[str, torch.nn.Module, tuple[str, float, float]]]:
    """The fused experts modules (pypto_capture.find_experts) the kernel can run."""
    from pypto_capture import find_experts

    modules = dict(model.named_modules())
    out = []
    for info in find_experts(model):
        module = modules[info.name] if info.name else model
        act = activation_of(module)
        if act is not None:
            out.append((info.name, module, act))
    return out


class MoEKernelPlugin:
    """Applies to any model whose fused experts the grouped GEMM can run."""

    name = "moe"

    def applies_to(self, model: torch.nn.Module) -> bool:
        return bool(fitting_experts(model))

    @contextlib.contextmanager
    def enable(self, model: torch.nn.Module) -> Iterator[None]:
        targets = fitting_experts(model)
        if not targets:
            raise ValueError(
                f"{type(model).__name__} has no fused gated experts the grouped GEMM can run"
            )
        PACKAGE.stats.reset()  # report() covers this enable(): one arm's calls
        restore = []
        try:
            for name, module, (act, alpha, limit) in targets:
                if getattr(module, _MARK, False):
                    raise ValueError(
                        f"{name} already runs the grouped GEMM; leave that enable() first"
                    )

                def forward(
                    self: Any,
                    hidden_states: torch.Tensor,
                    top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor,
                    _act: str = act,
                    _alpha: float = alpha,
                    _limit: float = limit,
                ) -> torch.Tensor:
                    return grouped_gemm(
                        hidden_states,
                        top_k_index,
                        top_k_weights,
                        self.gate_up_proj,
                        self.down_proj,
                        _act,
                        _alpha,
                        _limit,
                    )

                restore.append(swap_forward(module, forward, _MARK))
            log.info("grouped-GEMM experts on %d MoE layers", len(restore))
            with PACKAGE.switches.pto_switches(grouped_gemm=True):
                yield
        finally:
            while restore:
                restore.pop()()

    def report(self) -> dict[str, Any]:
        return PACKAGE.report()


PLUGIN = MoEKernelPlugin()
