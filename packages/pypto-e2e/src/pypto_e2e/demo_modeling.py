"""Modeling the demo preset pins the embedded demo model to.

The demo shows the pinning step doing real work: after ``pypto-patch`` the folder's
``auto_map`` names these classes, and the smoke gate and bench load them (the report
names the class), not transformers' built-in Llama. They are Llama underneath because
the embedded model was trained as one; a real family package hooks its kernels here.
"""

from __future__ import annotations

from transformers import LlamaConfig, LlamaForCausalLM

__all__ = ["PyptoDemoConfig", "PyptoDemoForCausalLM"]


class PyptoDemoConfig(LlamaConfig):
    """Llama config under the demo's own class name (model_type stays ``llama``)."""


class PyptoDemoForCausalLM(LlamaForCausalLM):
    """The demo model's pinned class: reviewed, versioned with pypto-e2e."""

    config_class = PyptoDemoConfig
    pinned_by = "pypto-e2e demo preset"
