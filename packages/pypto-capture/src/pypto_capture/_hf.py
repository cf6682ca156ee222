"""Feature detection over transformers 5.8-5.24 model objects (no version compares)."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any, cast

import torch

__all__ = [
    "accepts_mask_mapping",
    "attn_implementation",
    "cache_kwarg",
    "decoder_of",
    "forward_params",
    "model_device_dtype",
    "model_specific_cache",
    "output_cache",
    "own_mask_builder",
    "set_attn_implementation",
    "text_config",
]


@functools.lru_cache(maxsize=256)
def _params_of(func: Any) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return frozenset()


def forward_params(model: torch.nn.Module) -> frozenset[str]:
    return _params_of(type(model).forward)


def cache_kwarg(model: torch.nn.Module) -> str:
    """5.24 renamed the forward kwarg ``past_key_values`` -> ``cache`` (old name deprecated)."""
    params = forward_params(model)
    return "cache" if "cache" in params else "past_key_values"


def output_cache(output: Any) -> Any:
    """The cache object returned by a forward, under either name."""
    # "cache_params": the SSM models' name before transformers moved them onto its shared cache.
    for name in ("cache", "past_key_values", "cache_params"):
        try:
            value = output[name] if isinstance(output, dict) else getattr(output, name, None)
        except (KeyError, AttributeError):
            value = None
        if value is not None:
            return value
    return None


def model_specific_cache(cache: Any) -> str | None:
    """The class name of a cache defined by one model's own modeling file (e.g.
    ``MiniMaxCache``, ``xLSTMCache``), or None for transformers' shared cache classes.

    Such models check the cache's type in their forward and refuse any other object, so a
    capture-safe cache cannot stand in for it."""
    module = type(cache).__module__ or ""
    return type(cache).__name__ if module.startswith("transformers.models.") else None


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack (``model.model`` for *ForCausalLM), whatever it is called."""
    get = getattr(model, "get_decoder", None)
    if callable(get):
        try:
            dec = get()
            if isinstance(dec, torch.nn.Module):
                return dec
        except Exception:
            pass
    return getattr(model, "base_model", model)


@functools.lru_cache(maxsize=64)
def _forward_accepts_mask_mapping(forward: Callable[..., Any]) -> bool:
    try:
        src = inspect.getsource(forward)
    except (OSError, TypeError):
        return False
    return "attention_mask, dict)" in src


def accepts_mask_mapping(model: torch.nn.Module) -> bool:
    """Whether the decoder takes ``attention_mask`` as a {layer_type: 4D mask} dict."""
    return _forward_accepts_mask_mapping(type(decoder_of(model)).forward)


# transformers' masking utilities take a prepared 4-D mask (or a {layer type: mask}
# mapping) as it is: what a captured step over static slots hands the model.
_MASKING_UTILS = "masking_utils"


@functools.lru_cache(maxsize=64)
def _module_source(module_name: str) -> str:
    module = sys.modules.get(module_name)
    try:
        return inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        return ""


def own_mask_builder(model: torch.nn.Module) -> str | None:
    """Why the decoder builds its attention inputs from a 2-D padding mask in its own code
    (so a 4-D mask over static slots cannot stand in for it), or None.

    Two shapes of model do, read from the code rather than listed by name: an ALiBi model
    whose bias is built from the 2-D mask (``build_alibi_tensor(attention_mask, ...)``:
    BLOOM, Falcon with ``alibi``), and a model whose modeling code does not use
    transformers' masking utilities at all (CPM-Ant, ProphetNet: masks and relative
    positions computed from a cache that grows by one key per step). Their graph step
    fails inside the model's own code (an unpack error, a shape mismatch, a position
    check); this names the reason before anything is captured.
    """
    decoder = decoder_of(model)
    module_name = type(decoder).__module__ or ""
    if not module_name.startswith("transformers.models."):
        return None  # remote or pinned code: judged by what it does, not by this rule
    mod = sys.modules.get(module_name)
    alibi = getattr(mod, "build_alibi_tensor", None) or getattr(decoder, "build_alibi_tensor", None)
    config = text_config(model)
    if callable(alibi) and "attention_mask" in _params_of(alibi) and getattr(config, "alibi", True):
        return (
            "builds its ALiBi bias from a 2-D padding mask over the keys (build_alibi_tensor), "
            "which a captured step over static cache slots does not hand it"
        )
    src = _module_source(module_name)
    if src and _MASKING_UTILS not in src:
        return (
            "builds its attention masks and relative positions in its own code from a cache "
            "that grows by one key per step (it does not use transformers' masking utilities, "
            "which take a prepared mask over static slots)"
        )
    return None


def text_config(model: Any) -> Any:
    config = getattr(model, "config", model)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def attn_implementation(model: torch.nn.Module) -> str | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    return getattr(config, "_attn_implementation", None)


def set_attn_implementation(model: torch.nn.Module, impl: str) -> None:
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter(impl)
        return
    # Older objects: the config attribute is read per call. (A transformers model: its
    # ``config`` is not on nn.Module's type.)
    cast(Any, model).config._attn_implementation = impl


def model_device_dtype(model: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    for p in model.parameters():
        return p.device, p.dtype
    return torch.device("cpu"), torch.float32
