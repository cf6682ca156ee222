"""The MiniMax presets for pypto-patch (entry-point group ``pypto.model_families``).

One preset per published checkpoint family. The placed files are two-line shims: the
code stays versioned by this installed package, and the model folder only records which
classes load it. Each preset's ``check`` refuses, before a byte is written, a config.json
that is not its family's or declares sizes no checkpoint has. Each preset's configuration shim exposes the config class of *its*
family, so a folder pinned with the wrong preset fails on load with one line naming the
preset that fits.

Standard library only: pypto-patch imports this module to list presets.
"""

from __future__ import annotations

from typing import Any

from . import __version__
from .checks import check_config_dict

__all__ = ["MINIMAX_M3", "MINIMAX_M27", "PRESETS"]

_MODELING = '''"""Placed by pypto-patch (preset {family}): the code lives in pypto-models-minimax."""
from pypto_models_minimax.modeling import {model}  # noqa: F401
'''

_CONFIGURATION = '''"""Placed by pypto-patch (preset {family}): the code lives in pypto-models-minimax."""
from pypto_models_minimax.configuration import {config}  # noqa: F401
'''

_FAMILIES = {
    "minimax_m27": (
        "PyptoMiniMaxM27Config",
        "PyptoMiniMaxM27ForCausalLM",
        "MiniMax-M2.7 (M2 architecture, 256 experts top-8; FP8 or BF16 release) with exact "
        "capture-safe MoE; MTP modules skipped",
    ),
    "minimax_m3": (
        "PyptoMiniMaxM3Config",
        "PyptoMiniMaxM3ForCausalLM",
        "MiniMax-M3's text backbone out of the VL checkpoint, capture-safe sparse-attention "
        "indexer and exact MoE",
    ),
}


def _checker(family: str) -> Any:
    def check(config: Any) -> None:
        """pypto-patch's pre-write check: the refusals the pinned config class raises."""
        check_config_dict(config, family)

    return check


def _preset(family: str) -> dict[str, Any]:
    config, model, description = _FAMILIES[family]
    stem = f"{family}_pypto"
    return {
        "family": family,
        "version": __version__,
        "description": description,
        "auto_map": {
            "AutoConfig": f"configuration_{stem}.{config}",
            "AutoModelForCausalLM": f"modeling_{stem}.{model}",
        },
        "files": {
            f"modeling_{stem}.py": _MODELING.format(family=family, model=model),
            f"configuration_{stem}.py": _CONFIGURATION.format(family=family, config=config),
        },
        "check": _checker(family),
    }


#: preset name -> preset dict; each is registered as its own entry point.
PRESETS: dict[str, dict[str, Any]] = {family: _preset(family) for family in _FAMILIES}
MINIMAX_M27 = PRESETS["minimax_m27"]
MINIMAX_M3 = PRESETS["minimax_m3"]
