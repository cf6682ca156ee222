"""transformers' native ``KimiLinearConfig``, read from the published config.json.

What the native config already reads from the published format, unchanged: the MoE keys
through its ``attribute_map`` (``num_experts`` -> ``num_local_experts``,
``num_experts_per_token`` -> ``num_experts_per_tok``, ``num_shared_experts`` ->
``n_shared_experts``, ``moe_renormalize`` -> ``norm_topk_prob``, ``num_expert_group`` ->
``n_group``, ``model_max_length`` -> ``max_position_embeddings``), and the KDA sizes out of
``linear_attn_config`` (``num_heads`` -> ``linear_num_heads``, ``head_dim`` ->
``linear_head_dim``, ``short_conv_kernel_size`` -> ``linear_conv_kernel_dim``).

What :func:`native_config_dict` translates before the native class sees the dict:

* ``layer_types`` from ``linear_attn_config``'s 1-based ``kda_layers`` /
  ``full_attn_layers``, refusing a plan that leaves a layer out (the native config would
  leave ``None`` there and build that layer as KDA);
* ``mlp_layer_types`` from ``num_experts`` / ``first_k_dense_replace`` / ``moe_layer_freq``
  as the published modeling reads them (the native config ignores ``moe_layer_freq``);
* ``use_grouped_topk: false`` becomes one expert group (``num_expert_group`` /
  ``topk_group`` 1), which is what the ungrouped top-k computes;
* ``rope_scaling: null`` is dropped (NoPE MLA; the native config only warns about the key).

Everything the native classes would compute differently from the published code
(softmax router, RoPE in MLA, a query LoRA, MTP layers, a quantized release) is refused
by :func:`pypto_models_kimi.checks.check_config_dict`; ``auto_map`` entries that would run
the folder's own code by :func:`pypto_models_kimi.checks.check_auto_map`. Both raise one
line. The published keys the native classes do not use (``mla_use_nope``, ``rope_theta``,
``moe_router_activation_func``, ...) stay on the config as plain attributes, so
``save_pretrained`` writes a config.json this class reads again.
"""

from __future__ import annotations

from typing import Any

from transformers.models.kimi_linear.configuration_kimi_linear import KimiLinearConfig

from .checks import check_auto_map, check_config_dict, layer_plan

__all__ = ["PyptoKimiLinearConfig", "native_config_dict"]


def native_config_dict(config: dict[str, Any]) -> dict[str, Any]:
    """The published config.json dict, checked and translated for ``KimiLinearConfig``.

    Raises ``KimiConfigError`` (one line) for anything this preset does not run exactly.
    """
    check_config_dict(config)
    attn, mlp = layer_plan(config)
    out = dict(config)
    out["layer_types"] = attn
    out["mlp_layer_types"] = mlp
    if "rope_scaling" in out and out["rope_scaling"] is None:
        # The release writes ``rope_scaling: null``; its MLA has no RoPE, and the native
        # config warns that the key is deprecated. Nothing to carry over.
        del out["rope_scaling"]
    if config.get("use_grouped_topk") is False:
        out["num_expert_group"] = 1
        out["topk_group"] = 1
    return out


class PyptoKimiLinearConfig(KimiLinearConfig):
    """``KimiLinearConfig`` reading the published config.json (see the module docstring)."""

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        check_auto_map(config_dict if isinstance(config_dict, dict) else {})
        return super().from_dict(native_config_dict(config_dict), **kwargs)
