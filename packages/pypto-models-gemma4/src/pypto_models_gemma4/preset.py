"""The Gemma 4 presets for pypto-patch (entry-point group ``pypto.model_families``).

One preset per published checkpoint family. The placed files are two-line shims: the
code stays versioned by this installed package, and the model folder only records which
classes load it. Each preset's configuration shim exposes the config class of *its*
variant, so a folder pinned with the wrong preset (a Llama folder, or the E2B checkpoint
pinned as the 31B) fails on load with one line naming the preset that fits.

Standard library only: pypto-patch imports this module to list presets.
"""

from __future__ import annotations

from typing import Any

from . import __version__
from .variants import VARIANTS

__all__ = ["PRESETS", "check_folder_config", "preset_for"]

# Class-name suffix per preset (configuration.CONFIG_CLASSES / modeling.MODEL_CLASSES).
_SUFFIX = {
    "gemma4_31b_it": "31B",
    "gemma4_26b_a4b_it": "26BA4B",
    "gemma4_e4b_it": "E4B",
    "gemma4_e2b_it": "E2B",
}

_MODELING = '''"""Placed by pypto-patch (preset {family}): the code lives in pypto-models-gemma4."""
from pypto_models_gemma4.modeling import (  # noqa: F401
    PyptoGemma4ForConditionalGeneration{suffix} as PyptoGemma4ForConditionalGeneration,
)
'''

_CONFIGURATION = '''"""Placed by pypto-patch (preset {family}): the code lives in pypto-models-gemma4."""
from pypto_models_gemma4.configuration import PyptoGemma4Config{suffix} as PyptoGemma4Config  # noqa: F401
'''


def preset_for(family: str) -> dict[str, Any]:
    """The contract-A dict pypto-patch validates (see pypto-patch's README)."""
    variant = VARIANTS[family]
    return {
        "family": family,
        "version": __version__,
        "description": variant.description,
        "auto_map": {
            "AutoConfig": "configuration_gemma4_pypto.PyptoGemma4Config",
            "AutoModelForCausalLM": "modeling_gemma4_pypto.PyptoGemma4ForConditionalGeneration",
            "AutoModelForImageTextToText": (
                "modeling_gemma4_pypto.PyptoGemma4ForConditionalGeneration"
            ),
        },
        "files": {
            "modeling_gemma4_pypto.py": _MODELING.format(family=family, suffix=_SUFFIX[family]),
            "configuration_gemma4_pypto.py": _CONFIGURATION.format(
                family=family, suffix=_SUFFIX[family]
            ),
        },
        # pypto-patch runs this before writing anything: a folder that is not this
        # variant's checkpoint is refused in one line, untouched (not only at load time).
        "check": lambda config: check_folder_config(family, config),
    }


#: preset name -> preset dict; each is registered as its own entry point.
PRESETS: dict[str, dict[str, Any]] = {family: preset_for(family) for family in VARIANTS}

GEMMA4_31B_IT = PRESETS["gemma4_31b_it"]
GEMMA4_26B_A4B_IT = PRESETS["gemma4_26b_a4b_it"]
GEMMA4_E4B_IT = PRESETS["gemma4_e4b_it"]
GEMMA4_E2B_IT = PRESETS["gemma4_e2b_it"]


def check_folder_config(family: str, config: Any) -> None:
    """Raise ``Gemma4ConfigError`` (one line) unless ``config`` (config.json as a dict) fits.

    For a pre-write check in pypto-patch: the same check the pinned config class runs at
    load time, available before anything is written to the folder.
    """
    from .variants import check_config_dict

    check_config_dict(config, family)
