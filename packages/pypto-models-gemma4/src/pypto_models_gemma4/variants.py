"""Gemma 4's published text variants and the decoder structure each has (stdlib only).

Every preset loads through the same modeling; what differs between checkpoints is the
decoder's structure: a mixture-of-experts block beside the dense MLP (26B-A4B), per-layer
input embeddings with KV-sharing layers (E2B, E4B), or neither (31B). Checking a folder's
config.json against the pinned preset's variant *before* anything is built turns "a Llama
folder pinned as gemma4_31b_it" or "the E2B checkpoint pinned with the 31B preset" into
one line naming the problem and the preset that fits, instead of a half-built model.

This module imports nothing beyond the standard library so that a stdlib-only caller
(pypto-patch listing presets, a pre-write check) can use it without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KNOWN_LAYER_TYPES",
    "VARIANTS",
    "Gemma4ConfigError",
    "Variant",
    "check_config_dict",
    "structure_of",
]

#: The attention layer types the capture-safe decode serves (ring per type).
KNOWN_LAYER_TYPES = ("sliding_attention", "full_attention")


class Gemma4ConfigError(ValueError):
    """A folder's config.json is not a Gemma 4 checkpoint this package (or preset) loads.

    ``str()`` is one line naming the problem and the fix.
    """


@dataclass(frozen=True)
class Variant:
    """One published checkpoint family and the decoder structure that identifies it."""

    family: str
    checkpoint: str
    description: str
    moe: bool
    per_layer_embeddings: bool
    kv_sharing: bool

    @property
    def structure(self) -> str:
        return _structure_words(self.moe, self.per_layer_embeddings, self.kv_sharing)


def _structure_words(moe: bool, ple: bool, kv: bool) -> str:
    parts = []
    if moe:
        parts.append("MoE block beside the dense MLP")
    if ple:
        parts.append("per-layer input embeddings")
    if kv:
        parts.append("KV-sharing layers")
    return ", ".join(parts) or "dense (no MoE, no per-layer embeddings, no KV sharing)"


VARIANTS: dict[str, Variant] = {
    v.family: v
    for v in (
        Variant(
            "gemma4_31b_it",
            "google/gemma-4-31B-it",
            "Gemma 4 31B-it (dense; 5 sliding : 1 full layers, K=V full layers with their own "
            "head shape, softcapped logits) with a capture-safe ring-buffer decode",
            moe=False,
            per_layer_embeddings=False,
            kv_sharing=False,
        ),
        Variant(
            "gemma4_26b_a4b_it",
            "google/gemma-4-26B-A4B-it",
            "Gemma 4 26B-A4B-it (MoE beside a dense MLP, sliding/full layers) with a "
            "capture-safe ring-buffer decode",
            moe=True,
            per_layer_embeddings=False,
            kv_sharing=False,
        ),
        Variant(
            "gemma4_e4b_it",
            "google/gemma-4-E4B-it",
            "Gemma 4 E4B-it (per-layer embeddings, KV-sharing layers) with a capture-safe "
            "ring-buffer decode; audio/vision towers load but text decode does not use them",
            moe=False,
            per_layer_embeddings=True,
            kv_sharing=True,
        ),
        Variant(
            "gemma4_e2b_it",
            "google/gemma-4-E2B-it",
            "Gemma 4 E2B-it (per-layer embeddings, KV-sharing layers, double-wide MLP) with a "
            "capture-safe ring-buffer decode; audio/vision towers load but text decode does not use them",
            moe=False,
            per_layer_embeddings=True,
            kv_sharing=True,
        ),
    )
}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def structure_of(text_config: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    """(MoE, per-layer embeddings, KV sharing) of a ``text_config`` dict."""
    return (
        bool(text_config.get("enable_moe_block")),
        _int(text_config.get("hidden_size_per_layer_input")) > 0,
        _int(text_config.get("num_kv_shared_layers")) > 0,
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_config_dict(config: Any, family: str | None = None) -> Variant:
    """Return the variant a config.json dict is, or raise ``Gemma4ConfigError`` (one line).

    ``family``: the pinned preset; its variant must match the folder's structure.
    None accepts any supported variant.
    """
    want = VARIANTS.get(family) if family is not None else None
    if family is not None and want is None:
        raise Gemma4ConfigError(
            f"unknown Gemma 4 preset {family!r}; choose one of {', '.join(sorted(VARIANTS))}"
        )
    pinned = f"the {family} preset" if family else "pypto-models-gemma4"
    fix = "restore the folder (pypto-patch restore) and pin the family that matches it"
    if not isinstance(config, Mapping):
        raise Gemma4ConfigError(
            f"config.json holds a JSON {type(config).__name__}, not an object: re-download the model"
        )
    model_type = config.get("model_type")
    if model_type != "gemma4":
        if isinstance(model_type, str) and model_type.startswith("gemma4"):
            raise Gemma4ConfigError(
                f"model_type {model_type!r} is a Gemma 4 variant {pinned} does not support: it "
                "loads the published Gemma4ForConditionalGeneration checkpoints (model_type 'gemma4')"
            )
        arch = config.get("architectures")
        raise Gemma4ConfigError(
            f"config.json is not a Gemma 4 checkpoint (model_type {_short(model_type)}, "
            f"architectures {_short(arch)}) but it is pinned with {pinned}; {fix}"
        )
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        raise Gemma4ConfigError(
            "config.json of a Gemma 4 checkpoint has no text_config object: re-download the model"
        )
    if text.get("use_bidirectional_attention") == "all":
        raise Gemma4ConfigError(
            "text_config.use_bidirectional_attention is 'all' (an encoder, not a causal decoder): "
            f"{pinned} decodes causal Gemma 4 checkpoints only"
        )
    layer_types = text.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise Gemma4ConfigError(
                "text_config.layer_types must be a list of strings: re-download the model"
            )
        unknown = sorted(set(layer_types) - set(KNOWN_LAYER_TYPES))
        if unknown:
            raise Gemma4ConfigError(
                f"text_config.layer_types has {unknown}, which {pinned} does not decode "
                f"(supported: {', '.join(KNOWN_LAYER_TYPES)})"
            )
        if "sliding_attention" in layer_types and _int(text.get("sliding_window", 512)) <= 0:
            raise Gemma4ConfigError(
                "text_config.sliding_window must be a positive integer for sliding layers: "
                "re-download the model"
            )
    found = structure_of(text)
    matching = [
        v for v in VARIANTS.values() if (v.moe, v.per_layer_embeddings, v.kv_sharing) == found
    ]
    if not matching:
        raise Gemma4ConfigError(
            f"this Gemma 4 checkpoint's decoder ({_structure_words(*found)}) matches no published "
            f"variant {pinned} supports ({', '.join(sorted(VARIANTS))})"
        )
    if want is not None:
        if want in matching:
            return want
        fits = " or ".join(v.family for v in matching)
        raise Gemma4ConfigError(
            f"this folder is a Gemma 4 checkpoint with {_structure_words(*found)}, but it is pinned "
            f"with {family} ({want.structure}); pin it with {fits} instead"
        )
    return matching[0]
