"""What a MiniMax config.json must say before anything is written or loaded.

Standard library only: pypto-patch runs :func:`check_config_dict` (through each preset's
``check``) before it writes a byte, and the pinned config classes run it again at load
time, so a folder of another family, or a config whose sizes no real checkpoint has (a
damaged or hostile ``num_hidden_layers: 1e9`` that would be built layer by layer until
memory ran out), is refused in one line with the folder untouched.
"""

from __future__ import annotations

from typing import Any

from .errors import MiniMaxConfigError

__all__ = ["MAX_LAYERS", "check_config_dict"]

#: The most layers a config may declare: no model this tool loads has more (the bound
#: pypto-models-kimi and the pipeline planner use too).
MAX_LAYERS = 1024

_M3_KEYS = (
    "sparse_attention_config",
    "moe_layer_freq",
    "mlp_layer_types",
    "dense_intermediate_size",
)


def _other_preset(model_type: Any) -> str:
    hints = {
        "minimax_m2": "minimax_m27",
        "minimax_m3_vl": "minimax_m3",
        "minimax_m3_vl_text": "minimax_m3",
    }
    hint = hints.get(str(model_type))
    if hint:
        return f"pin it with the {hint} preset"
    return "pin it with its own family's preset (pypto-patch list)"


def check_config_dict(config: Any, family: str) -> None:
    """Raise ``MiniMaxConfigError`` (one line) unless ``config`` (a config.json dict) is a
    checkpoint of ``family`` ("minimax_m27" or "minimax_m3")."""
    if not isinstance(config, dict):
        raise MiniMaxConfigError(
            f"config.json holds a JSON {type(config).__name__}, not an object: re-download the model"
        )
    model_type = config.get("model_type")
    if family == "minimax_m27":
        if model_type != "minimax_m2":
            raise MiniMaxConfigError(
                f"config.json has model_type {model_type!r}, not 'minimax_m2': this folder is "
                f"not a MiniMax M2.x checkpoint; {_other_preset(model_type)}"
            )
        kinds = config.get("attn_type_list")
        if isinstance(kinds, list) and any(k != 1 for k in kinds):
            raise MiniMaxConfigError(
                "config.json's attn_type_list has lightning-attention layers (0s): that is "
                "MiniMax-Text-01/M1, not M2.x; the minimax_m27 preset runs full attention only"
            )
        _check_layers(config)
        quant = config.get("quantization_config")
        if quant is not None:
            _check_quantization(quant)
        return
    if family == "minimax_m3":
        text = config.get("text_config") if model_type == "minimax_m3_vl" else config
        text_type = text.get("model_type") if isinstance(text, dict) else None
        looks_m3 = isinstance(text, dict) and any(k in text for k in _M3_KEYS)
        if text_type not in (None, "", "minimax_m3_vl_text") or not looks_m3:
            raise MiniMaxConfigError(
                f"config.json has model_type {model_type!r} and no MiniMax M3 text config "
                f"(sparse_attention_config / moe_layer_freq): not a MiniMax M3 checkpoint; "
                f"{_other_preset(model_type)}"
            )
        _check_layers(text if isinstance(text, dict) else {})
        return
    raise MiniMaxConfigError(f"unknown MiniMax family {family!r}: minimax_m27 or minimax_m3")


def _check_quantization(quant: Any) -> None:
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    fmt = quant.get("fmt", "float8_e4m3fn") if isinstance(quant, dict) else None
    block = quant.get("weight_block_size", [128, 128]) if isinstance(quant, dict) else None
    if method != "fp8" or fmt != "float8_e4m3fn":
        raise MiniMaxConfigError(
            f"config.json's quantization_config is {method!r}/{fmt!r}; this loader reads the "
            "released FP8 e4m3 block format only: use the FP8 or BF16 release"
        )
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(isinstance(b, int) and b > 0 for b in block)
    ):
        raise MiniMaxConfigError(
            f"config.json's weight_block_size {block!r} is not two positive ints: re-download the model"
        )


def _check_layers(config: dict[str, Any]) -> None:
    n = config.get("num_hidden_layers")
    if n is None:
        return  # the native config's default applies
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_LAYERS:
        shown = repr(n)
        shown = shown if len(shown) <= 60 else shown[:60] + "..."
        raise MiniMaxConfigError(
            f"config.json's num_hidden_layers is {shown}, not an integer in 1..{MAX_LAYERS} "
            "(no model this tool loads has more): a damaged or hostile config; re-download the model"
        )
