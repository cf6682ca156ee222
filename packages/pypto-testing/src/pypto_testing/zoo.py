"""Every causal LM transformers ships, as a tiny folder: the zoo the support matrix runs.

Why: users port whatever architecture is new this year, not the families we ship presets
for. :mod:`pypto_testing.architectures` holds hand-made tiny configs of the hybrids and
sparse-attention types (every layer type present); this module reaches the rest of
transformers' causal-LM mapping with one generic recipe: the type's **own config class**,
called with the small values of :data:`ZOO_SHAPE` for every attribute it has (and each of its
sub-configs: text, vision, audio), so that what the constructor derives follows them (a
class that refuses that falls back to its defaults shrunk afterwards), per-layer patterns (``layer_types``, a hybrid pattern string) cut to the
shortest run that still holds every distinct layer kind, then transformers' own model class
built from it, its weights spread (so greedy decoding does not collapse onto one token),
and a forward of four tokens to prove it runs. A type the recipe cannot make small and
runnable raises :class:`CannotBuildTiny` with why ("cannot be built tiny: ..." in the
matrix), never a half-built folder.

"Newest" is read from the year in the type's ``configuration_*.py`` copyright line (the
installed package carries no release dates); ties and unknown years sort by name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .models import SPECIAL_TOKENS, write_byte_tokenizer

__all__ = [
    "MAX_PARAMETERS",
    "RECIPES",
    "ZOO_SHAPE",
    "CannotBuildTiny",
    "make_zoo_model",
    "newest_types",
    "type_year",
    "zoo_config",
    "zoo_types",
]

#: Generic small values, applied where the config class has the attribute.
ZOO_SHAPE: dict[str, Any] = {
    "vocab_size": len(SPECIAL_TOKENS) + 256,
    "unpadded_vocab_size": len(SPECIAL_TOKENS) + 256,
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 2,
    "swa_head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "index_topk": 4,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "d_model": 64,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_inner": 128,
    "ffn_dim": 128,
    "decoder_layers": 2,
    "decoder_attention_heads": 4,
    "decoder_ffn_dim": 128,
    "encoder_layers": 2,
    "encoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "num_layers": 2,
    "num_heads": 4,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}

#: A folder past this many parameters was not made small by the recipe (a dimension the
#: recipe does not know kept its published size): refused rather than built.
MAX_PARAMETERS = 20_000_000

_PATTERN_LISTS = ("layer_types", "layers_block_type", "block_types", "mlp_layer_types")
_PATTERN_STRINGS = ("hybrid_override_pattern",)


class CannotBuildTiny(Exception):
    """The generic recipe cannot make this type small and runnable (the message says why)."""


def zoo_types(*, image_text: bool = False) -> list[str]:
    """Every model type of transformers' causal-LM mapping (sorted); ``image_text``: those of
    the image-text-to-text mapping too (their text decoders)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    types = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if image_text:
        types |= set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    return sorted(types)


def type_year(model_type: str) -> int | None:
    """The year in the type's configuration file's copyright line, or None."""
    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module = model_type_to_module_name(model_type)
    path = Path(transformers.__file__).parent / "models" / module / f"configuration_{module}.py"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return None
    found = re.search(r"Copyright (?:\(c\) )?(\d{4})", head)
    return int(found.group(1)) if found else None


def newest_types(n: int | None = None) -> list[str]:
    """The causal types, newest first (copyright year, then name); the first ``n``."""
    types = sorted(zoo_types(), key=lambda t: (-(type_year(t) or 0), t))
    return types if n is None else types[:n]


def _attr(config: Any, key: str) -> Any:
    """``config.key``, or None where it is absent or not one value (a per-layer attribute
    some 2026 config classes refuse to read globally)."""
    try:
        return getattr(config, key, None)
    except Exception:
        return None


def _shrink(config: Any) -> None:
    for key, value in ZOO_SHAPE.items():
        current = _attr(config, key)
        if current is None and not _has(config, key):
            continue
        if callable(current):
            continue
        try:
            setattr(config, key, value)
        except Exception:  # a read-only, derived or per-layer attribute: left as it was
            continue
    for key in _PATTERN_LISTS:
        pattern = _attr(config, key)
        if isinstance(pattern, (list, tuple)) and pattern:
            kinds = list(dict.fromkeys(pattern))
            n = max(int(ZOO_SHAPE["num_hidden_layers"]), len(kinds))
            setattr(config, key, [kinds[i % len(kinds)] for i in range(n)])
            config.num_hidden_layers = n
    for key in _PATTERN_STRINGS:
        pattern = _attr(config, key)
        if isinstance(pattern, str) and pattern:
            distinct = "".join(dict.fromkeys(pattern))
            n = max(int(ZOO_SHAPE["num_hidden_layers"]), len(distinct))
            setattr(config, key, (distinct * n)[:n])
            config.num_hidden_layers = n
    window = _attr(config, "sliding_window")
    if isinstance(window, int) and window > 16:
        config.sliding_window = 16  # short enough that a decode passes it
    # Multi-head latent attention rotates only its rope part: transformers' MLA configs set
    # head_dim to qk_rope_head_dim, which the generic head_dim above overwrote.
    rope = _attr(config, "qk_rope_head_dim")
    if isinstance(rope, int) and _has(config, "head_dim"):
        _set(config, "head_dim", rope)
    if _attr(config, "kv_lora_rank") is not None and _has(config, "num_key_value_heads"):
        # MLA expands its latent to every query head: the published configs say so too
        _set(config, "num_key_value_heads", _attr(config, "num_attention_heads"))
    rotary = _attr(config, "rotary_dim")
    if isinstance(rotary, int) and rotary > int(ZOO_SHAPE["head_dim"]):
        _set(config, "rotary_dim", int(ZOO_SHAPE["head_dim"]))


def _has(config: Any, key: str) -> bool:
    try:
        return hasattr(config, key)
    except Exception:
        return False


def _set(config: Any, key: str, value: Any) -> None:
    try:
        setattr(config, key, value)
    except Exception:
        pass


#: How a type's config is made small, in the order :func:`make_zoo_model` tries them.
RECIPES: tuple[str, ...] = ("constructed", "shrunk")


def _small_kwargs(config: Any) -> dict[str, Any]:
    """The generic small values (and cut per-layer patterns) for the attributes ``config``
    has, as constructor keywords."""
    out: dict[str, Any] = {}
    for key, value in ZOO_SHAPE.items():
        current = _attr(config, key)
        if (current is None and not _has(config, key)) or callable(current):
            continue
        out[key] = value
    layers = 0
    for key in _PATTERN_LISTS:
        pattern = _attr(config, key)
        if isinstance(pattern, (list, tuple)) and pattern:
            kinds = list(dict.fromkeys(pattern))
            n = max(int(ZOO_SHAPE["num_hidden_layers"]), len(kinds))
            out[key] = [kinds[i % len(kinds)] for i in range(n)]
            layers = max(layers, n)
    for key in _PATTERN_STRINGS:
        pattern = _attr(config, key)
        if isinstance(pattern, str) and pattern:
            distinct = "".join(dict.fromkeys(pattern))
            n = max(int(ZOO_SHAPE["num_hidden_layers"]), len(distinct))
            out[key] = (distinct * n)[:n]
            layers = max(layers, n)
    if layers and "num_hidden_layers" in out:
        out["num_hidden_layers"] = layers
    return out


def _constructed(config_class: Any) -> Any:
    """The config built from the small values (every sub-config too: text, vision, audio),
    so what the class derives in its constructor (a head size, an inner width, a per-layer
    list) follows them instead of keeping the published size."""
    from transformers import PretrainedConfig

    default = config_class()
    kwargs = _small_kwargs(default)
    for name, value in vars(default).items():
        if isinstance(value, PretrainedConfig):
            kwargs[name] = {**value.to_dict(), **_small_kwargs(value)}
    config = config_class(**kwargs)
    # What the constructor derived must still be a shape: Dory derives its looped layers as
    # num_hidden_layers minus the input and output sections it keeps at their published
    # sizes, -14 at two layers (a model that runs, computing nothing a real one does).
    before, after = default.to_dict(), config.to_dict()
    for key, value in after.items():
        old = before.get(key)
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and value < 0
            and isinstance(old, int)
            and old >= 0
        ):
            raise CannotBuildTiny(f"the small values derive {key}={value}")
    return config


def zoo_config(model_type: str, *, recipe: str = "constructed") -> Any:
    """The tiny config of ``model_type``: a hand-made one from
    :mod:`pypto_testing.architectures` when it has one, else the generic recipe:

    - ``constructed``: the config class called with the small values (and each sub-config's),
      then the shrink below for what the constructor kept;
    - ``shrunk``: the default config with the small values set afterwards (what a class
      derived in its constructor keeps its published size).
    """
    from transformers import CONFIG_MAPPING

    from .architectures import ARCHITECTURES, architecture_config

    if recipe not in RECIPES:
        raise ValueError(f"unknown zoo recipe {recipe!r}: choose one of {', '.join(RECIPES)}")
    if model_type in ARCHITECTURES and not ARCHITECTURES[model_type].get("vl"):
        return architecture_config(model_type)
    if model_type not in CONFIG_MAPPING:
        raise CannotBuildTiny(f"{model_type!r} has no config class in this transformers")
    try:
        if recipe == "constructed":
            config = _constructed(CONFIG_MAPPING[model_type])
        else:
            config = CONFIG_MAPPING[model_type]()
    except CannotBuildTiny:
        raise
    except Exception as err:
        what = "the small values" if recipe == "constructed" else "arguments"
        raise CannotBuildTiny(f"its config class refuses {what}: {_short(err)}") from err
    _shrink(config)
    try:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
    except Exception as err:  # several text configs (an encoder and a decoder)
        raise CannotBuildTiny(f"its config has no single text config: {_short(err)}") from err
    if text is not config:
        _shrink(text)
    return config


def make_zoo_model(path: str | Path, model_type: str, *, seed: int = 0) -> Path:
    """A loadable tiny folder of ``model_type`` built by transformers' own classes (config,
    safetensors weights, generation config, a byte-level tokenizer); raises
    :class:`CannotBuildTiny` (nothing left at ``path``) when no recipe can (each one's
    reason, in :data:`RECIPES` order). The ``constructed`` recipe is tried first; a type it
    cannot build falls back to ``shrunk``, so no type the older recipe built is lost."""
    from .architectures import ARCHITECTURES

    if model_type in ARCHITECTURES and not ARCHITECTURES[model_type].get("vl"):
        return _make(Path(path), model_type, RECIPES[0], seed)  # hand-made: one config
    failures: list[str] = []
    for recipe in RECIPES:
        try:
            return _make(Path(path), model_type, recipe, seed)
        except CannotBuildTiny as err:
            failures.append(f"{recipe}: {err}")
    raise CannotBuildTiny("; ".join(failures))


def _make(folder: Path, model_type: str, recipe: str, seed: int) -> Path:
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from .architectures import spread_weights

    config = zoo_config(model_type, recipe=recipe)
    # Sized on the meta device first: a dimension the recipe does not know keeps its
    # published size, and allocating that for real is how a zoo run gets OOM-killed.
    try:
        with torch.device("meta"):
            params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    except Exception as err:
        raise CannotBuildTiny(f"the model class refuses the small config: {_short(err)}") from err
    if params > MAX_PARAMETERS:
        raise CannotBuildTiny(
            f"{params / 1e6:.0f}M parameters at the generic small shape (a dimension the "
            "recipe does not know kept its published size)"
        )
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_config(config)
    except Exception as err:
        raise CannotBuildTiny(f"the model class refuses the small config: {_short(err)}") from err
    spread_weights(model, seed)
    model.eval()
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([[3, 4, 5, 6]]), use_cache=False)
        if not bool(torch.isfinite(out.logits).all()):
            raise CannotBuildTiny("its logits at the small shape are not finite")
    except CannotBuildTiny:
        raise
    except Exception as err:
        raise CannotBuildTiny(f"a 4-token forward fails: {_short(err)}") from err
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_byte_tokenizer(folder)
        model.generation_config.pad_token_id = 0
        model.save_pretrained(str(folder), safe_serialization=True)
    except Exception as err:
        shutil.rmtree(folder, ignore_errors=True)
        raise CannotBuildTiny(f"it does not save: {_short(err)}") from err
    try:  # what a loader will do with it: the saved config and weights load back
        AutoModelForCausalLM.from_pretrained(str(folder))
    except Exception as err:
        shutil.rmtree(folder, ignore_errors=True)
        raise CannotBuildTiny(f"its saved folder does not load back: {_short(err)}") from err
    (folder / "zoo.json").write_text(
        json.dumps({"model_type": model_type, "parameters": params, "recipe": recipe})
    )
    return folder.resolve()


def _short(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
