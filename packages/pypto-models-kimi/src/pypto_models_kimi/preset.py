"""The Kimi-Linear preset for pypto-patch (entry-point group ``pypto.model_families``).

One preset, ``kimi_linear_48b_a3b``, for both published checkpoints
(``moonshotai/Kimi-Linear-48B-A3B-Instruct`` and ``-Base``: same architecture, same
config.json and weight layout). The placed files are two-line shims: the code stays
versioned by this installed package, and the model folder only records which classes load
it. pypto-patch makes config.json's ``auto_map`` exactly the preset's and drops the repo's
other entries (its ``AutoModel`` and tokenizer ``AutoTokenizer``), so the repo's
``configuration_kimi.py`` / ``modeling_kimi.py`` / ``tokenization_kimi.py`` never run.
The preset's ``check`` runs before pypto-patch writes anything: a folder that is not a
Kimi-Linear checkpoint is refused untouched.

Standard library only: pypto-patch imports this module to list presets.
"""

from __future__ import annotations

from typing import Any

from . import __version__
from .checks import FAMILY, PRESET_AUTO_MAP, check_config_dict

__all__ = ["KIMI_LINEAR_48B_A3B", "PRESETS"]

_MODELING = '''"""Placed by pypto-patch (preset {family}): the code lives in pypto-models-kimi."""
from pypto_models_kimi.modeling import PyptoKimiLinearForCausalLM  # noqa: F401
'''

_CONFIGURATION = '''"""Placed by pypto-patch (preset {family}): the code lives in pypto-models-kimi."""
from pypto_models_kimi.configuration import PyptoKimiLinearConfig  # noqa: F401
'''


def _check(config: Any) -> None:
    """pypto-patch's pre-write check: the same refusals the pinned config class raises."""
    check_config_dict(config)


def _preset() -> dict[str, Any]:
    config_module = PRESET_AUTO_MAP["AutoConfig"].split(".")[0]
    model_module = PRESET_AUTO_MAP["AutoModelForCausalLM"].split(".")[0]
    return {
        "family": FAMILY,
        "version": __version__,
        "description": (
            "Kimi-Linear-48B-A3B (Instruct / Base; KDA linear + MLA full attention, MoE) on "
            "transformers' native KimiLinear classes, loaded strictly from the published format"
        ),
        "auto_map": dict(PRESET_AUTO_MAP),
        "files": {
            f"{model_module}.py": _MODELING.format(family=FAMILY),
            f"{config_module}.py": _CONFIGURATION.format(family=FAMILY),
        },
        "check": _check,
    }


#: preset name -> preset dict; each is registered as its own entry point.
PRESETS: dict[str, dict[str, Any]] = {FAMILY: _preset()}
KIMI_LINEAR_48B_A3B = PRESETS[FAMILY]
