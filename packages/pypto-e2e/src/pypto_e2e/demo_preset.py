"""The ``pypto_demo`` preset, registered for pypto-patch through ``pypto.model_families``.

The placed modules are two-line shims that import the installed package, so the code
that runs stays versioned by pypto-e2e instead of being copied into every model folder.
"""

from __future__ import annotations

from . import __version__

__all__ = ["PRESET"]

PRESET = {
    "family": "pypto_demo",
    "version": __version__,
    "description": "the embedded demo model (Llama architecture) pinned to pypto-e2e's demo modeling",
    "auto_map": {
        "AutoConfig": "configuration_pypto_demo.PyptoDemoConfig",
        "AutoModelForCausalLM": "modeling_pypto_demo.PyptoDemoForCausalLM",
    },
    "files": {
        "configuration_pypto_demo.py": (
            '"""Placed by pypto-patch (preset pypto_demo): the code lives in pypto-e2e."""\n'
            "from pypto_e2e.demo_modeling import PyptoDemoConfig  # noqa: F401\n"
        ),
        "modeling_pypto_demo.py": (
            '"""Placed by pypto-patch (preset pypto_demo): the code lives in pypto-e2e."""\n'
            "from pypto_e2e.demo_modeling import PyptoDemoConfig, PyptoDemoForCausalLM  # noqa: F401\n"
        ),
    },
}
