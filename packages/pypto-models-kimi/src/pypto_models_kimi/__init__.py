"""Kimi-Linear (48B-A3B Instruct / Base) on transformers' native KimiLinear classes.

Importing the package loads only the standard-library pieces (preset, checks, errors) so
that pypto-patch can list the preset without torch; the config and model classes load on
first use (``pypto_models_kimi.PyptoKimiLinearForCausalLM``, or import
``pypto_models_kimi.modeling``).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from .errors import KimiConfigError, KimiError, KimiWeightsError

_LAZY = {
    "PyptoKimiLinearConfig": "configuration",
    "native_config_dict": "configuration",
    "PyptoKimiLinearForCausalLM": "modeling",
    "LoadReport": "loading",
    "load_checkpoint": "loading",
}

__all__ = [
    "KimiConfigError",
    "KimiError",
    "KimiWeightsError",
    "LoadReport",
    "PyptoKimiLinearConfig",
    "PyptoKimiLinearForCausalLM",
    "__version__",
    "load_checkpoint",
    "native_config_dict",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
