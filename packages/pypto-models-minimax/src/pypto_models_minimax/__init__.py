"""MiniMax M2.7 and M3 (text backbone) on transformers' native classes.

Importing the package loads only the standard-library pieces (presets, errors) so that
pypto-patch can list the presets without torch; the config and model classes load on
first use (``pypto_models_minimax.PyptoMiniMaxM27ForCausalLM``, or import
``pypto_models_minimax.modeling``).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from .errors import MiniMaxConfigError, MiniMaxError, MiniMaxWeightsError

_LAZY = {
    "PyptoMiniMaxM27Config": "configuration",
    "PyptoMiniMaxM3Config": "configuration",
    "PyptoMiniMaxM27ForCausalLM": "modeling",
    "PyptoMiniMaxM3ForCausalLM": "modeling",
    "PyptoMiniMaxM3Attention": "modeling",
    "dequantize_fp8_blocks": "loading",
    "load_checkpoint": "loading",
}

__all__ = [
    "MiniMaxConfigError",
    "MiniMaxError",
    "MiniMaxWeightsError",
    "PyptoMiniMaxM3Attention",
    "PyptoMiniMaxM3Config",
    "PyptoMiniMaxM3ForCausalLM",
    "PyptoMiniMaxM27Config",
    "PyptoMiniMaxM27ForCausalLM",
    "__version__",
    "dequantize_fp8_blocks",
    "load_checkpoint",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
