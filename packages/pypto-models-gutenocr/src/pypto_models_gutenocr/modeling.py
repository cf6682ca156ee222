"""GutenOCR on transformers' native Qwen2.5-VL classes, with three kernel hooks.

Nothing is vendored: :class:`GutenOCRForConditionalGeneration` builds the native
model and then re-classes exactly the text decoder's modules (its RMSNorms, MLPs,
rotary embedding and attention) to thin subclasses whose ``forward`` consults the
switches in :mod:`pypto_kernels_gutenocr`. The vision tower (hidden 1280) keeps
its own classes, so its norms can never reach a kernel. With every switch off
each hook calls the parent's ``forward``: logits are bit-identical to the native
model with the same weights.

MRoPE: transformers 5.x merges the temporal/height/width cos/sin in the rotary
module. With the MRoPE switch on, the rotary hook returns the three-axis
[3, B, S, D] cos/sin instead and the attention hook hands them, with the
mrope_section, to the kernel that does the split and the rotation.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qvl

from pypto_kernels_gutenocr import (
    mrope_pto_correct,
    rms_norm_wrapper,
    swiglu_mlp_wrapper,
    switches,
)

from .configuration import GutenOCRConfig

FAMILY = "gutenocr"


class GutenOCRTextRMSNorm(qvl.Qwen2_5_VLRMSNorm):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if switches.is_on("rms_norm"):
            return rms_norm_wrapper(hidden_states, self.weight, self.variance_epsilon)
        return super().forward(hidden_states)


class GutenOCRTextMLP(qvl.Qwen2MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if switches.is_on("swiglu_mlp"):
            return swiglu_mlp_wrapper(self, x)
        return super().forward(x)


class GutenOCRTextRotaryEmbedding(qvl.Qwen2_5_VLRotaryEmbedding):
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        if not switches.is_on("mrope") or self.rope_type != "default":
            return super().forward(x, position_ids)
        # Three-axis form: one cos/sin row per position axis, split later by the kernel.
        position_ids = position_ids.expand(3, -1, -1)
        freqs = position_ids[..., None].float() * self.inv_freq.to(
            device=x.device, dtype=torch.float
        )
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class GutenOCRTextAttention(qvl.Qwen2_5_VLAttention):
    """Native attention; only the rotary step is routed when cos/sin are three-axis."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Any,
    ):
        # None goes to the parent too, which raises for it exactly as it always has.
        if position_embeddings is None or position_embeddings[0].dim() != 4:
            return super().forward(
                hidden_states,
                attention_mask=attention_mask,
                position_ids=position_ids,
                position_embeddings=position_embeddings,
                **kwargs,
            )
        # The parent's forward with apply_rotary_pos_emb swapped for the MRoPE kernel.
        # ``cache`` (5.24) and ``past_key_values`` (earlier 5.x) name the same thing.
        cache = kwargs.pop("cache", None)
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        bsz, q_len, _ = hidden_states.size()
        q = self.q_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        # normalize_mrope_section put the section here (a plain dict) when the config was built.
        rope = cast("dict[str, Any]", self.config.rope_parameters)
        q, k = mrope_pto_correct(q, k, cos, sin, rope["mrope_section"])
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
        interface = qvl.ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, qvl.eager_attention_forward
        )
        kwargs.pop("use_cache", None)
        out, weights = interface(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            position_ids=position_ids,
            **kwargs,
        )
        out = self.o_proj(out.reshape(bsz, q_len, -1).contiguous())
        return out, weights


_HOOKS = {
    qvl.Qwen2_5_VLRMSNorm: GutenOCRTextRMSNorm,
    qvl.Qwen2MLP: GutenOCRTextMLP,
    qvl.Qwen2_5_VLRotaryEmbedding: GutenOCRTextRotaryEmbedding,
    qvl.Qwen2_5_VLAttention: GutenOCRTextAttention,
}


def install_hooks(text_model: torch.nn.Module) -> dict[str, int]:
    """Re-class the text decoder's hookable modules in place; returns counts per hook."""
    counts: dict[str, int] = {}
    for module in text_model.modules():
        hook = _HOOKS.get(type(module))
        if hook is not None:
            module.__class__ = hook
            counts[hook.__name__] = counts.get(hook.__name__, 0) + 1
    return counts


class GutenOCRForConditionalGeneration(qvl.Qwen2_5_VLForConditionalGeneration):
    """Qwen2.5-VL with switchable PyPTO kernels in the text decoder only."""

    config_class = GutenOCRConfig
    pypto_kernel_family = FAMILY  # pypto-kernels-gutenocr's plug-in looks for this marker

    def __init__(self, config: GutenOCRConfig) -> None:
        super().__init__(config)
        self.hook_counts = install_hooks(self.model.language_model)


def _register_weight_layout() -> None:
    """Checkpoints use Qwen2.5-VL's key layout; give the GutenOCR class the same mapping.

    transformers 5.x renames checkpoint keys (``model.layers.*`` ->
    ``model.language_model.layers.*``) by class name; without this, a GutenOCR load
    would leave every weight "missing".
    """
    try:
        from transformers import conversion_mapping as cm
    except ImportError:  # older 5.x: class-level _checkpoint_conversion_mapping does it
        return
    get = getattr(cm, "get_checkpoint_conversion_mapping", None)
    register = getattr(cm, "register_checkpoint_conversion_mapping", None)
    name = GutenOCRForConditionalGeneration.__name__
    if get is None or register is None or get(name) is not None:
        return
    mapping = get(qvl.Qwen2_5_VLForConditionalGeneration.__name__)
    if mapping is not None:
        register(name, mapping)


def register_auto_classes() -> None:
    """Map model_type "gutenocr" in the Auto classes (idempotent)."""
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
    )

    _register_weight_layout()
    try:
        AutoConfig.register(FAMILY, GutenOCRConfig)
    except ValueError:
        pass  # already registered
    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
        try:
            auto.register(GutenOCRConfig, GutenOCRForConditionalGeneration)
        except ValueError:
            pass


__all__ = [
    "GutenOCRConfig",
    "GutenOCRForConditionalGeneration",
    "GutenOCRTextAttention",
    "GutenOCRTextMLP",
    "GutenOCRTextRMSNorm",
    "GutenOCRTextRotaryEmbedding",
    "install_hooks",
    "register_auto_classes",
]
