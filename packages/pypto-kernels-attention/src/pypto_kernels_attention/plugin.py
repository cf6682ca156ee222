"""The ``pypto.kernels`` plug-in for Gemma 4 (model_type ``gemma4`` / ``gemma4_text``).

``enable(model)`` routes the single-token decode attention of the covered layers through
the ``pypto_attention::gqa_decode`` custom op; everything else (prefill, a layer it does
not cover, a call outside the kernel's envelope) keeps the model's own attention. It
works through transformers' attention-interface hook rather than by replacing forwards:

- an attention function is registered (``AttentionInterface``) under a name derived from
  the implementation the model already uses (``pypto_gqa_decode+eager``, ``...+sdpa``),
  and the same mask function as that implementation is registered under it
  (``AttentionMaskInterface``), so masks are built exactly as before;
- the text configs the attention modules read get that name as ``_attn_implementation``;
  the covered modules are marked with an attribute the function checks.

On exit the configs get their old implementation back and the marks are removed. The
registered names stay (they are inert while no config names them).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch

from pypto_kernels_common import compiling

from . import ops
from .package import PACKAGE

log = logging.getLogger(__name__)

__all__ = ["FAMILY", "MODEL_TYPES", "PLUGIN", "Gemma4AttentionPlugin"]

FAMILY = "gemma4"
MODEL_TYPES = ("gemma4", "gemma4_text")
MARK = "pypto_gqa_decode"
PREFIX = "pypto_gqa_decode+"
ATTENTION_CLASS = "Gemma4TextAttention"


def _base_function(base: str, module: torch.nn.Module) -> Callable[..., Any]:
    """The attention function ``base`` names for ``module`` (the model's own eager one
    when ``base`` is "eager" or unregistered), which decode falls back to."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:  # pragma: no cover - every transformers modeling file defines one
        raise RuntimeError(f"{type(module).__module__} has no eager_attention_forward")
    if base == "eager":
        return eager
    return ALL_ATTENTION_FUNCTIONS.get_interface(base, eager)


def _bias_from_mask(
    mask: torch.Tensor | None, b: int, s: int, like: torch.Tensor
) -> torch.Tensor | None:
    """The kernel's ``[B, S]`` additive bias from the model's decode mask, or None when the
    mask is not a one-query-row mask over these ``s`` slots."""
    if mask is None:
        return torch.zeros(b, s, dtype=torch.float32, device=like.device)
    if mask.dim() != 4 or mask.shape[-2] != 1 or mask.shape[-1] != s or mask.shape[1] != 1:
        return None
    row = mask[:, 0, 0, :]
    if row.dtype == torch.bool:
        neg = torch.finfo(torch.float32).min
        row = torch.where(row, 0.0, neg).to(torch.float32)
    return row.to(torch.float32).expand(b, s)


def _make_attention(base: str) -> Callable[..., Any]:
    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        softcap: float | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if getattr(module, MARK, False) and query.shape[2] == 1 and not dropout:
            bias = _bias_from_mask(attention_mask, query.shape[0], key.shape[2], query)
            if bias is not None:
                scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
                out = ops.gqa_decode(query, key, value, bias, scale, softcap)
                return out.transpose(1, 2).contiguous(), None
            if not compiling():
                PACKAGE.stats.record_fallback("gqa_decode", "decode mask is not [B, 1, 1, S]")
        fn = _base_function(base, module)
        return fn(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            softcap=softcap,
            **kwargs,
        )

    return attention


def _register(base: str) -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = PREFIX + base
    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, _make_attention(base))
    mapping = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    if name not in mapping:
        if base not in mapping:
            raise ValueError(
                f"attention implementation {base!r} has no mask function; load the model with "
                "attn_implementation='eager' or 'sdpa' to use the Gemma 4 attention kernels"
            )
        AttentionMaskInterface.register(name, cast("Callable[..., Any]", mapping[base]))
    return name


def _model_type(model: torch.nn.Module) -> str | None:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", None)


class Gemma4AttentionPlugin:
    """Contract C (pypto-bench): ``name``, ``applies_to``, ``enable``, ``report``.

    ``layers``: "all" (default) covers every attention layer that holds its own
    keys/values; "sliding" only the sliding-window layers (the seed's NPU choice:
    head_dim 256, window 1024 on the 31B).
    """

    name = FAMILY

    def __init__(self, layers: str = "all") -> None:
        if layers not in ("all", "sliding"):
            raise ValueError(f"layers={layers!r}: use 'all' or 'sliding'")
        self.layers = layers

    def applies_to(self, model: torch.nn.Module) -> bool:
        return _model_type(model) in MODEL_TYPES and bool(self._modules(model))

    def _modules(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        found = [m for m in model.modules() if type(m).__name__ == ATTENTION_CLASS]
        if self.layers == "sliding":
            found = [m for m in found if getattr(m, "is_sliding", False)]
        return found

    @contextlib.contextmanager
    def enable(self, model: torch.nn.Module) -> Iterator[None]:
        if _model_type(model) not in MODEL_TYPES:
            raise ValueError(
                f"{type(model).__name__} (model_type {_model_type(model)!r}) is not a Gemma 4 "
                f"model; this plug-in covers model_type {' / '.join(MODEL_TYPES)}"
            )
        modules = self._modules(model)
        PACKAGE.stats.reset()  # report() covers this enable(): one arm's calls
        if not modules:
            raise ValueError(f"{type(model).__name__} has no {ATTENTION_CLASS} layers to route")
        configs: dict[int, Any] = {}
        for m in modules:
            configs.setdefault(id(m.config), m.config)
        before = {key: cfg._attn_implementation for key, cfg in configs.items()}
        names = {key: _register(str(base or "eager")) for key, base in before.items()}
        try:
            for key, cfg in configs.items():
                cfg._attn_implementation = names[key]
            for m in modules:
                setattr(m, MARK, True)
            log.info(
                "routing the decode attention of %d Gemma 4 layers through PyPTO", len(modules)
            )
            with PACKAGE.switches.pto_switches(gqa_decode=True):
                yield
        finally:
            for m in modules:
                if hasattr(m, MARK):
                    delattr(m, MARK)
            for key, cfg in configs.items():
                cfg._attn_implementation = before[key]

    def report(self) -> dict[str, Any]:
        return PACKAGE.report()


PLUGIN = Gemma4AttentionPlugin()
