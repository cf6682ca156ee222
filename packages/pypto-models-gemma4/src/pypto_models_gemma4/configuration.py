"""Gemma 4's native config, refusing folders that are not the pinned Gemma 4 variant.

transformers builds a config from whatever config.json a folder holds: a Llama folder
pinned with a Gemma 4 preset would silently become a Gemma 4 model with default sizes and
random weights. ``from_dict`` (which ``from_pretrained`` goes through) first checks the
dict with :func:`pypto_models_gemma4.variants.check_config_dict` and raises one line
naming the problem and the preset that fits.

The checkpoint's fields are read unchanged: ``global_head_dim`` and
``num_global_key_value_heads`` (the full layers' head shape) are plain config attributes
in transformers 5.8 and become ``per_layer_config`` in 5.24; both are the native config's
own handling, so nothing here rewrites them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from transformers.models.gemma4.configuration_gemma4 import Gemma4Config

from .variants import check_config_dict

__all__ = [
    "CONFIG_CLASSES",
    "PyptoGemma4Config",
    "PyptoGemma4Config26BA4B",
    "PyptoGemma4Config31B",
    "PyptoGemma4ConfigE2B",
    "PyptoGemma4ConfigE4B",
]


class PyptoGemma4Config(Gemma4Config):
    """Gemma4Config that accepts only a supported Gemma 4 checkpoint's config.json.

    ``pypto_family`` names the preset whose variant the folder must be (None: any
    supported variant); the preset-specific subclasses below set it.
    """

    pypto_family: ClassVar[str | None] = None

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        check_config_dict(config_dict, cls.pypto_family)
        return super().from_dict(config_dict, **kwargs)


class PyptoGemma4Config31B(PyptoGemma4Config):
    pypto_family = "gemma4_31b_it"


class PyptoGemma4Config26BA4B(PyptoGemma4Config):
    pypto_family = "gemma4_26b_a4b_it"


class PyptoGemma4ConfigE4B(PyptoGemma4Config):
    pypto_family = "gemma4_e4b_it"


class PyptoGemma4ConfigE2B(PyptoGemma4Config):
    pypto_family = "gemma4_e2b_it"


#: preset name -> the config class its placed configuration file exposes.
CONFIG_CLASSES: dict[str, type[PyptoGemma4Config]] = {
    c.pypto_family: c
    for c in (
        PyptoGemma4Config31B,
        PyptoGemma4Config26BA4B,
        PyptoGemma4ConfigE4B,
        PyptoGemma4ConfigE2B,
    )
    if c.pypto_family is not None
}
