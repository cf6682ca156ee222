"""What a Kimi-Linear config.json must say before anything loads or is written.

Standard library only: pypto-patch runs :func:`check_config_dict` (through the preset's
``check``) before it writes a byte, and the pinned config class runs it again at load time.
Both refuse in one line, so a Llama folder pinned as Kimi-Linear, or a checkpoint variant
the native classes would compute differently from the published code, fails before a
model is built instead of producing a quietly different model.

The published config.json (``moonshotai/Kimi-Linear-48B-A3B-Instruct`` / ``-Base``) keeps
the layer plan in ``linear_attn_config`` (1-based ``kda_layers`` / ``full_attn_layers``)
and the MoE plan in ``first_k_dense_replace`` / ``moe_layer_freq``; :func:`layer_plan`
reads both the way the published modeling does (layer ``i`` is MoE when
``i >= first_k_dense_replace and i % moe_layer_freq == 0``). transformers' native config
derives the attention plan the same way but leaves gaps in it as ``None`` (which the
native decoder then builds as KDA) and ignores ``moe_layer_freq``; here a gap is an
error and ``moe_layer_freq`` is honoured.

:func:`check_auto_map` keeps the folder's own Python from running: every ``auto_map``
entry must name a module file in the folder (no ``repo--module.Class`` reference into
another repository, no path), and once the folder is pinned (``AutoConfig`` is this
preset's) every entry must be exactly the preset's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import KimiConfigError

__all__ = [
    "FAMILY",
    "PRESET_AUTO_MAP",
    "check_auto_map",
    "check_config_dict",
    "layer_plan",
]

#: The preset's name (``pypto-patch apply --model-family kimi_linear_48b_a3b``).
FAMILY = "kimi_linear_48b_a3b"
_STEM = f"{FAMILY}_pypto"
#: What pypto-patch writes into config.json's ``auto_map`` for this preset.
PRESET_AUTO_MAP: dict[str, str] = {
    "AutoConfig": f"configuration_{_STEM}.PyptoKimiLinearConfig",
    "AutoModelForCausalLM": f"modeling_{_STEM}.PyptoKimiLinearForCausalLM",
}
_REPIN = f"re-pin the folder (pypto-patch apply --model-family {FAMILY})"
# transformers splits a class reference on exactly one dot: "<module file stem>.<Class>",
# the module being a file at the top of the folder.
_LOCAL_REF = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")


def _fail(problem: str, fix: str = "re-download the model") -> KimiConfigError:
    return KimiConfigError(" ".join(f"{problem}: {fix}".split()))


def _int(config: Mapping[str, Any], key: str, *, minimum: int, default: Any = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(f"config.json's {key} is {value!r}, not an integer >= {minimum}")
    return value


#: The most layers a config may declare (the pipeline planner's rule: no model this tool
#: loads has more).
MAX_LAYERS = 1024


def _clip(items: list[int], most: int = 8) -> str:
    """A list for a one-line message: at most ``most`` items, then how many more."""
    head = ", ".join(str(i) for i in items[:most])
    return f"[{head}{f', ... {len(items) - most} more' if len(items) > most else ''}]"


def _layer_list(lac: Mapping[str, Any], key: str, n: int) -> list[int]:
    value = lac.get(key)
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= n for i in value
    ):
        shown = repr(value)
        shown = shown if len(shown) <= 120 else shown[:120] + f"... ({len(shown)} characters)"
        raise _fail(
            f"config.json's linear_attn_config[{key!r}] is {shown}, not a list of 1-based "
            f"layer numbers in 1..{n}"
        )
    return value


def layer_plan(config: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(attention type, MLP type) per layer for a Kimi-Linear config.json dict.

    Attention: ``"linear_attention"`` (KDA) or ``"full_attention"`` (MLA), from
    ``linear_attn_config`` when present (the published format), else from an explicit
    ``layer_types`` (a config transformers wrote). MLP: ``"dense"`` or ``"sparse"`` (MoE),
    from ``num_experts`` / ``first_k_dense_replace`` / ``moe_layer_freq`` unless
    ``mlp_layer_types`` is given; when both forms are present they must agree. Raises ``KimiConfigError``.
    """
    n = _int(config, "num_hidden_layers", minimum=1)
    if n > MAX_LAYERS:
        # Bounded before anything is built from it: 1e9 layers was a MemoryError traceback.
        raise _fail(
            f"config.json's num_hidden_layers is {n}, more than the {MAX_LAYERS} any model "
            "this tool loads has: a damaged or hostile config"
        )
    lac = config.get("linear_attn_config")
    given = config.get("layer_types")
    if lac is not None:
        if not isinstance(lac, Mapping):
            raise _fail(
                f"config.json's linear_attn_config is a {type(lac).__name__}, not an object"
            )
        kda = _layer_list(lac, "kda_layers", n)
        full = _layer_list(lac, "full_attn_layers", n)
        both = sorted(set(kda) & set(full))
        neither = sorted(set(range(1, n + 1)) - set(kda) - set(full))
        if both or neither or len(set(kda)) != len(kda) or len(set(full)) != len(full):
            what = (
                f"layer(s) {_clip(both)} in both"
                if both
                else f"layer(s) {_clip(neither)} in neither"
            )
            if not both and not neither:
                what = "a layer listed twice"
            raise _fail(
                f"config.json's linear_attn_config must split layers 1..{n} between "
                f"kda_layers and full_attn_layers (1-based), but has {what}"
            )
        attn = ["linear_attention" if i + 1 in set(kda) else "full_attention" for i in range(n)]
        if given is not None and list(given) != attn:
            raise _fail(
                "config.json's layer_types disagree with its linear_attn_config "
                "(kda_layers / full_attn_layers)"
            )
    elif isinstance(given, list) and len(given) == n:
        if not all(t in ("linear_attention", "full_attention") for t in given):
            raise _fail(
                f"config.json's layer_types {given!r} hold types other than "
                "'linear_attention' / 'full_attention'"
            )
        attn = list(given)
    else:
        raise _fail(
            "config.json has no linear_attn_config (kda_layers / full_attn_layers) and no "
            f"layer_types for its {n} layers: not a Kimi-Linear checkpoint"
        )

    mlp_given = config.get("mlp_layer_types")
    first = _int(config, "first_k_dense_replace", minimum=0, default=0)
    freq = _int(config, "moe_layer_freq", minimum=1, default=1)
    # The published modeling builds MoE only when the config has experts at all.
    moe = config.get("num_experts", config.get("num_local_experts")) is not None
    derived = ["sparse" if moe and i >= first and i % freq == 0 else "dense" for i in range(n)]
    if mlp_given is not None:
        if (
            not isinstance(mlp_given, list)
            or len(mlp_given) != n
            or not all(t in ("dense", "sparse") for t in mlp_given)
        ):
            raise _fail(f"config.json's mlp_layer_types {mlp_given!r} are not {n} of dense/sparse")
        published = "first_k_dense_replace" in config or "moe_layer_freq" in config
        if published and list(mlp_given) != derived:
            raise _fail(
                "config.json's mlp_layer_types disagree with its first_k_dense_replace / "
                "moe_layer_freq"
            )
        return attn, list(mlp_given)
    return attn, derived


def check_config_dict(config: Any) -> None:
    """Raise ``KimiConfigError`` (one line) unless ``config`` (a config.json dict) is a
    Kimi-Linear checkpoint this preset computes exactly as the published code does."""
    if not isinstance(config, Mapping):
        raise _fail(f"config.json holds a JSON {type(config).__name__}, not an object")
    model_type = config.get("model_type")
    if model_type != "kimi_linear":
        raise _fail(
            f"config.json has model_type {model_type!r}, not 'kimi_linear': this folder is "
            "not a Kimi-Linear checkpoint",
            "pin it with its own family's preset (pypto-patch list)",
        )
    if config.get("quantization_config") is not None:
        method = config["quantization_config"]
        method = method.get("quant_method") if isinstance(method, Mapping) else method
        raise _fail(
            f"config.json has a quantization_config ({method!r}); this preset loads the "
            "released bfloat16 weights only",
            "use moonshotai/Kimi-Linear-48B-A3B-Instruct or -Base",
        )
    layer_plan(config)
    experts = config.get("num_experts", config.get("num_local_experts"))
    if isinstance(experts, bool) or not isinstance(experts, int) or experts < 1:
        raise _fail(
            f"config.json's num_experts is {experts!r}; this preset runs the MoE model (the "
            "released checkpoints have 256 experts)"
        )
    top_k = config.get("num_experts_per_token", config.get("num_experts_per_tok"))
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise _fail(f"config.json's num_experts_per_token {top_k!r} is not in 1..{experts}")
    if config.get("use_grouped_topk", True) is not False:
        groups = config.get("num_expert_group", config.get("n_group", 1))
        topk_group = config.get("topk_group", 1)
        if not (
            isinstance(groups, int)
            and isinstance(topk_group, int)
            and groups >= 1
            and experts % groups == 0
            and experts // groups >= 2  # the router ranks groups by their top-2 scores
            and 1 <= topk_group <= groups
        ):
            raise _fail(
                f"config.json's num_expert_group {groups!r} / topk_group {topk_group!r} "
                f"do not divide its {experts} experts"
            )
    router = config.get("moe_router_activation_func", "sigmoid")
    if router != "sigmoid":
        raise _fail(
            f"config.json's moe_router_activation_func is {router!r}; transformers' "
            "Kimi-Linear router is sigmoid only (as the released checkpoints)",
            "this preset cannot run this checkpoint",
        )
    # The published config class defaults mla_use_nope to False (RoPE in MLA); the native
    # MLA has no RoPE. A published-format config must therefore say True.
    nope = config.get("mla_use_nope", "linear_attn_config" not in config)
    if nope is not True:
        raise _fail(
            f"config.json's mla_use_nope is {config.get('mla_use_nope')!r}; transformers' "
            "Kimi-Linear MLA runs without RoPE (mla_use_nope: true, as the released checkpoints)",
            "this preset cannot run this checkpoint",
        )
    if config.get("q_lora_rank") is not None:
        raise _fail(
            f"config.json's q_lora_rank is {config['q_lora_rank']!r}; the released "
            "checkpoints project queries directly (q_lora_rank: null) and this loader reads "
            "that layout only",
            "this preset cannot run this checkpoint",
        )
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads")
    if kv_heads is not None and kv_heads != heads:
        raise _fail(
            f"config.json's num_key_value_heads {kv_heads!r} differs from num_attention_heads "
            f"{heads!r}; Kimi-Linear's MLA expands its latent to every head",
            "this preset cannot run this checkpoint",
        )
    if config.get("num_nextn_predict_layers") not in (None, 0):
        raise _fail(
            f"config.json has num_nextn_predict_layers {config['num_nextn_predict_layers']!r}; "
            "the released checkpoints have none and this loader reads no MTP layers",
            "this preset cannot run this checkpoint",
        )
    if config.get("tie_word_embeddings") is True:
        raise _fail(
            "config.json ties the word embeddings; the released checkpoints store lm_head "
            "separately (tie_word_embeddings: false)",
            "this preset cannot run this checkpoint",
        )
    lac = config.get("linear_attn_config")
    if isinstance(lac, Mapping):
        for key in ("num_heads", "head_dim", "short_conv_kernel_size"):
            if key in lac:
                _int(lac, key, minimum=1)


def _refs(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [r for r in value if r is not None]
    if isinstance(value, Mapping):  # {backend: ref}
        return list(value.values())
    return [value]


def check_auto_map(config: Mapping[str, Any]) -> None:
    """Raise ``KimiConfigError`` (one line) if config.json's ``auto_map`` could make
    transformers run code other than this package's (see the module docstring)."""
    auto_map = config.get("auto_map")
    if auto_map is None:
        return
    if not isinstance(auto_map, Mapping):
        raise _fail(f"config.json's auto_map is a {type(auto_map).__name__}, not an object", _REPIN)
    for key, value in auto_map.items():
        for ref in _refs(value):
            if not isinstance(ref, str):
                raise _fail(
                    f"config.json auto_map[{key!r}] = {ref!r} is not a class reference", _REPIN
                )
            if "--" in ref:
                raise _fail(
                    f"config.json auto_map[{key!r}] = {ref!r} points outside the folder (code "
                    "from another repository)",
                    _REPIN,
                )
            if not _LOCAL_REF.match(ref):
                raise _fail(
                    f"config.json auto_map[{key!r}] = {ref!r} points outside the folder (not "
                    "'module.Class' with the module at the folder's top level)",
                    _REPIN,
                )
    if auto_map.get("AutoConfig") != PRESET_AUTO_MAP["AutoConfig"]:
        return  # not loaded through the pin (the class was called directly)
    for key, value in auto_map.items():
        if PRESET_AUTO_MAP.get(key) != value:
            raise _fail(
                f"config.json auto_map[{key!r}] = {value!r} is not the {FAMILY} preset's "
                "class, so the folder's own code would run",
                _REPIN,
            )
