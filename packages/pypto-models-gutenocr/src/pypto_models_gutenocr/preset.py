"""The ``gutenocr_3b`` preset for pypto-patch (contract A).

The placed files are two-line shims: the code stays versioned by this installed
package, and the model folder only records which classes to load.
"""

from __future__ import annotations

from . import __version__

__all__ = ["PRESET"]

_MODELING = '''"""Placed by pypto-patch (preset gutenocr_3b): the code lives in pypto-models-gutenocr."""
from pypto_models_gutenocr.modeling import *  # noqa: F403
from pypto_models_gutenocr.modeling import GutenOCRForConditionalGeneration  # noqa: F401
'''

_CONFIGURATION = '''"""Placed by pypto-patch (preset gutenocr_3b): the code lives in pypto-models-gutenocr."""
from pypto_models_gutenocr.configuration import *  # noqa: F403
from pypto_models_gutenocr.configuration import GutenOCRConfig  # noqa: F401
'''

PRESET = {
    "family": "gutenocr_3b",
    "version": __version__,
    "description": "GutenOCR-3B (Qwen2.5-VL) with switchable PyPTO RMSNorm/MRoPE/SwiGLU in the text decoder",
    "auto_map": {
        "AutoConfig": "configuration_gutenocr.GutenOCRConfig",
        "AutoModelForCausalLM": "modeling_gutenocr.GutenOCRForConditionalGeneration",
        "AutoModelForImageTextToText": "modeling_gutenocr.GutenOCRForConditionalGeneration",
    },
    "files": {
        "modeling_gutenocr.py": _MODELING,
        "configuration_gutenocr.py": _CONFIGURATION,
    },
}
