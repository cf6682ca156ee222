"""The ``llada2_moe`` preset for pypto-patch (contract A).

The placed files are two-line shims: the code stays versioned by this installed package,
and the model folder only records which classes to load, under the names the LLaDA2
checkpoints' own ``auto_map`` uses (``configuration_llada2_moe.LLaDA2MoeConfig``,
``modeling_llada2_moe.LLaDA2MoeModel`` / ``LLaDA2MoeModelLM``).
"""

from __future__ import annotations

from typing import Any

from . import __version__

__all__ = ["PRESET"]

_MODELING = '''"""Placed by pypto-patch (preset llada2_moe): the code lives in pypto-models-llada2."""
from pypto_models_llada2.modeling import *  # noqa: F403
from pypto_models_llada2.modeling import LLaDA2MoeModel, LLaDA2MoeModelLM  # noqa: F401
'''

_CONFIGURATION = '''"""Placed by pypto-patch (preset llada2_moe): the code lives in pypto-models-llada2."""
from pypto_models_llada2.configuration import *  # noqa: F403
from pypto_models_llada2.configuration import LLaDA2MoeConfig  # noqa: F401
'''


def _check(config: Any) -> None:
    """pypto-patch's pre-write check: a layer count no checkpoint has is refused before
    a byte is written (the config class refuses it again at load)."""
    from .configuration import LLaDA2ConfigError, check_layer_count

    if not isinstance(config, dict):
        raise LLaDA2ConfigError(
            f"config.json holds a JSON {type(config).__name__}, not an object: re-download the model"
        )
    if "num_hidden_layers" in config:
        check_layer_count(config["num_hidden_layers"])


PRESET: dict[str, Any] = {
    "family": "llada2_moe",
    "version": __version__,
    "description": "LLaDA2-MoE block-diffusion LM (LLaDA2.0-mini/-flash) on transformers 5.x, with a block KV cache and a captured step",
    "auto_map": {
        "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
        "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
        "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
    },
    "files": {
        "modeling_llada2_moe.py": _MODELING,
        "configuration_llada2_moe.py": _CONFIGURATION,
    },
    "check": _check,
}
