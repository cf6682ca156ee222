"""transformers' native MiniMax configs, refusing folders that are not the pinned family.

transformers builds a config from whatever config.json a folder holds: a Llama folder
pinned with a MiniMax preset would silently become a MiniMax model with default sizes.
``from_dict`` (which ``from_pretrained`` goes through) first checks the dict and raises
one line naming the problem and the preset that fits.

The checkpoints' fields are read by the native configs unchanged (M2's top-level
``rotary_dim``/``rope_theta``; M3's legacy ``sparse_attention_config``, ``moe_layer_freq``,
``hidden_act: swigluoai``). Two things differ:

* M2.7's FP8 release carries a ``quantization_config``. It is moved to
  ``checkpoint_quantization`` so transformers' own FP8 quantizer never engages (it needs
  ``accelerate``, dequantises partial edge blocks with the wrong block size and keeps the
  model flagged as quantized); this package's loader dequantises instead.
* M3's config.json is the vision-language one; :class:`PyptoMiniMaxM3Config` is the text
  config (``base_config_key = "text_config"``), so ``from_pretrained`` reads the
  ``text_config`` part, and a full VL dict passed to ``from_dict`` is reduced to it too.
"""

from __future__ import annotations

from typing import Any

from transformers.models.minimax_m2.configuration_minimax_m2 import MiniMaxM2Config
from transformers.models.minimax_m3_vl.configuration_minimax_m3_vl import MiniMaxM3VLTextConfig

from .checks import check_config_dict

__all__ = ["PyptoMiniMaxM3Config", "PyptoMiniMaxM27Config"]

#: Tensor parallelism of the pinned classes (``pypto-bench run --nproc N``; styles:
#: pypto_bench.multi.tensor). Attention as transformers' own MiniMax plans: q, k and v
#: computed split and gathered (M2's q/k norms span all heads), the attention whole on every
#: rank, ``o_proj`` taking its input slice and summing over ranks. Every routed expert's
#: matrices split (gate|up halves, down's input dim), the experts' weighted sum reduced once
#: per layer; M3's shared expert and dense MLPs split the same way (transformers' plan
#: leaves them whole). Router, indexer, norms, embeddings and the head stay whole.
_ATTENTION_TP = {
    "layers.*.self_attn.q_proj": "colwise_gather_output",
    "layers.*.self_attn.k_proj": "colwise_gather_output",
    "layers.*.self_attn.v_proj": "colwise_gather_output",
    "layers.*.self_attn.o_proj": "rowwise_split_input",
}
_EXPERTS_TP = {
    "layers.*.mlp.experts.gate_up_proj": "packed_colwise",
    "layers.*.mlp.experts.down_proj": "rowwise",
    "layers.*.mlp.experts": "moe_tp_experts",
}
M27_TP_PLAN = {**_ATTENTION_TP, **_EXPERTS_TP}
M3_TP_PLAN = {
    **_ATTENTION_TP,
    **_EXPERTS_TP,
    "layers.*.mlp.shared_experts.gate_up_proj": "packed_colwise",
    "layers.*.mlp.shared_experts.down_proj": "rowwise",
    "layers.*.mlp.gate_up_proj": "packed_colwise",
    "layers.*.mlp.down_proj": "rowwise",
}


class PyptoMiniMaxM27Config(MiniMaxM2Config):
    """MiniMaxM2Config accepting only an M2.x checkpoint; FP8 settings kept aside."""

    pypto_tp_plan = M27_TP_PLAN

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        check_config_dict(config_dict, "minimax_m27")
        config_dict = dict(config_dict)
        quant = config_dict.pop("quantization_config", None)
        config = super().from_dict(config_dict, **kwargs)
        result = config[0] if isinstance(config, tuple) else config
        result.checkpoint_quantization = quant
        return config


def _text_part(config_dict: dict[str, Any]) -> dict[str, Any]:
    """The VL dict's text_config, carrying the top-level ``auto_map``: the Auto classes
    find the pinned model class through the config object's ``auto_map``."""
    text = dict(config_dict["text_config"])
    if "auto_map" in config_dict:
        text.setdefault("auto_map", config_dict["auto_map"])
    return text


class PyptoMiniMaxM3Config(MiniMaxM3VLTextConfig):
    """M3's text config, read from the VL checkpoint's config.json."""

    pypto_tp_plan = M3_TP_PLAN

    @classmethod
    def get_config_dict(cls, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        config_dict, rest = super().get_config_dict(*args, **kwargs)
        if config_dict.get("model_type") == "minimax_m3_vl" and isinstance(
            config_dict.get("text_config"), dict
        ):
            # from_pretrained keeps only text_config (base_config_key); keep auto_map with it.
            config_dict = {**config_dict, "text_config": _text_part(config_dict)}
        return config_dict, rest

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        check_config_dict(config_dict, "minimax_m3")
        if config_dict.get("model_type") == "minimax_m3_vl":
            config_dict = _text_part(config_dict)
        return super().from_dict(config_dict, **kwargs)
