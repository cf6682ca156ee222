"""GutenOCR's config: Qwen2.5-VL's, with the mrope_section placed where 5.x reads it.

Checkpoints written by transformers 4.x keep ``rope_scaling`` (``{"type": "mrope",
"mrope_section": [16, 24, 24]}``) at the top level and sometimes also carry a
``text_config`` without it. transformers 5.x reads rope settings from
``text_config.rope_parameters`` only and, when ``mrope_section`` is absent there,
silently assumes [16, 24, 24]. :func:`normalize_mrope_section` finds the section
wherever the checkpoint put it, checks it covers half the head dim, and writes it
into ``text_config.rope_parameters`` so the kernels and the rotary agree.
"""

from __future__ import annotations

from typing import Any, cast

from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLTextConfig,
)

__all__ = [
    "DEFAULT_MROPE_SECTION",
    "GutenOCRConfig",
    "MRopeSectionError",
    "normalize_mrope_section",
]

DEFAULT_MROPE_SECTION = (16, 24, 24)


class MRopeSectionError(ValueError):
    """The config's mrope_section cannot describe this model's head dim."""


def _section_from(params: Any) -> list[int] | None:
    if isinstance(params, dict) and params.get("mrope_section") is not None:
        return [int(v) for v in params["mrope_section"]]
    return None


def normalize_mrope_section(
    config: Qwen2_5_VLConfig, raw: dict[str, Any] | None = None
) -> list[int]:
    """Put the checkpoint's mrope_section into ``config.text_config.rope_parameters``."""
    # A dict only while a config is being built; __post_init__ calls us after it is an object.
    text = cast(Qwen2_5_VLTextConfig, config.text_config)
    params = dict(getattr(text, "rope_parameters", None) or {})
    raw = raw or {}
    raw_text_value = raw.get("text_config")
    raw_text: dict[str, Any] = raw_text_value if isinstance(raw_text_value, dict) else {}
    section = (
        _section_from(params)
        or _section_from(raw_text.get("rope_parameters"))
        or _section_from(raw_text.get("rope_scaling"))
        or _section_from(raw.get("rope_parameters"))
        or _section_from(raw.get("rope_scaling"))
    )
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if section is None:
        if head_dim != 2 * sum(DEFAULT_MROPE_SECTION):
            raise MRopeSectionError(
                f"config has no mrope_section and head_dim {head_dim} does not fit the default "
                f"{list(DEFAULT_MROPE_SECTION)}; add rope_parameters.mrope_section to config.json"
            )
        section = list(DEFAULT_MROPE_SECTION)
    if len(section) != 3 or 2 * sum(section) != head_dim:
        raise MRopeSectionError(
            f"mrope_section {section} must have 3 parts summing to head_dim/2 = {head_dim // 2}"
        )
    if params.get("rope_type", params.get("type")) == "mrope":
        params["rope_type"] = "default"
    params.setdefault("rope_type", "default")
    params["mrope_section"] = section
    text.rope_parameters = params
    return section


class GutenOCRConfig(Qwen2_5_VLConfig):
    """Qwen2.5-VL config under its own model_type so Auto classes map to GutenOCR."""

    model_type = "gutenocr"

    def __post_init__(self, **kwargs: Any) -> None:
        raw = {k: kwargs.get(k) for k in ("rope_scaling", "rope_parameters") if kwargs.get(k)}
        if isinstance(self.text_config, dict):
            raw["text_config"] = dict(self.text_config)
        super().__post_init__(**kwargs)
        normalize_mrope_section(self, raw)
