"""Gemma 4 on transformers' native classes, with capture-safe decode through pypto-capture.

Importing the package loads only the standard-library pieces (variants, presets) so that
pypto-patch can list the presets without torch; the config and model classes load on
first use (``pypto_models_gemma4.PyptoGemma4ForConditionalGeneration``, or import
``pypto_models_gemma4.modeling``).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from .variants import VARIANTS, Gemma4ConfigError, Variant, check_config_dict

_LAZY = {
    "PyptoGemma4Config": "configuration",
    "CONFIG_CLASSES": "configuration",
    "PyptoGemma4ForConditionalGeneration": "modeling",
    "Gemma4WeightsError": "modeling",
    "decode_layout": "layout",
    "expected_cache_bytes": "layout",
}

__all__ = [
    "CONFIG_CLASSES",
    "VARIANTS",
    "Gemma4ConfigError",
    "Gemma4WeightsError",
    "PyptoGemma4Config",
    "PyptoGemma4ForConditionalGeneration",
    "Variant",
    "__version__",
    "check_config_dict",
    "decode_layout",
    "expected_cache_bytes",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
