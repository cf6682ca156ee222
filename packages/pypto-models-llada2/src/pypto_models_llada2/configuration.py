"""LLaDA2-MoE's config, reading the published checkpoints' config.json as written.

Why a classic ``__init__`` (the remote-code style) rather than transformers' dataclass
fields: it is the one config style every transformers 5.x release accepts unchanged, and
the checkpoints' config.json carries fields (``rope_theta``, ``rope_scaling``,
``partial_rotary_factor``, ``router_dtype`` ...) that 5.x would otherwise rename or drop.

Every field of LLaDA2.0-mini/-flash is accepted; the ones that change the computation are
checked here, so a config this modeling cannot run exactly fails at load with one line
naming the field, never with a wrong forward.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

MODEL_TYPE = "llada2_moe"
#: The hub checkpoints' type, and dFactory's training name for the same network.
ACCEPTED_MODEL_TYPES = (MODEL_TYPE, "llada2_moe_veomni")

#: Ids of LLaDA2.0's tokenizer (pad and EOS share an id).
DEFAULT_MASK_TOKEN_ID = 156895
DEFAULT_EOS_TOKEN_ID = 156892


#: The most layers a config may declare: no model this tool loads has more (the bound
#: the other families and the pipeline planner use too).
MAX_LAYERS = 1024


class LLaDA2ConfigError(ValueError):
    """The config describes something this modeling cannot compute exactly."""


def check_layer_count(value: Any) -> None:
    """Refuse a ``num_hidden_layers`` that is not an integer in 1..MAX_LAYERS.

    Why: the model is built layer by layer from it, so a damaged or hostile 1e9 ran until
    memory was gone; pypto-patch runs this through the preset's ``check`` before it writes
    anything, and the config class again at load.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LAYERS:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:60] + "..."
        raise LLaDA2ConfigError(
            f"config.json's num_hidden_layers is {shown}, not an integer in 1..{MAX_LAYERS} "
            "(no model this tool loads has more): a damaged or hostile config; re-download the model"
        )


class LLaDA2MoeConfig(PretrainedConfig):
    """Configuration of LLaDA2-MoE (``model_type: llada2_moe``); defaults are LLaDA2.0-mini's."""

    model_type = MODEL_TYPE
    #: Tensor parallelism (``pypto-bench run --nproc N``; styles: pypto_bench.multi.tensor).
    #: The fused q|k|v projection keeps each rank's heads of every part, the attention then
    #: runs this rank's heads (its head counts divided), ``dense`` sums over ranks; dense and
    #: shared MLPs split Megatron-style; every routed expert's matrices split the same way
    #: (gate|up halves, down's input dim), the experts' weighted sum reduced once per layer.
    #: Router, norms, embeddings and the head stay whole on every rank.
    pypto_tp_plan = {  # noqa: RUF012  (read-only class data, the plan of every instance)
        "layers.*.attention.query_key_value": (
            "packed_colwise:num_attention_heads,num_key_value_heads,num_key_value_heads"
        ),
        "layers.*.attention": "local_heads:num_heads,num_key_value_heads",
        "layers.*.attention.dense": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
        "layers.*.mlp.shared_experts.gate_proj": "colwise",
        "layers.*.mlp.shared_experts.up_proj": "colwise",
        "layers.*.mlp.shared_experts.down_proj": "rowwise",
        "layers.*.mlp.experts.gate_up_proj": "packed_colwise",
        "layers.*.mlp.experts.down_proj": "rowwise",
        "layers.*.mlp.experts": "moe_tp_experts",
    }

    def __init__(
        self,
        vocab_size: int = 157184,
        hidden_size: int = 2048,
        intermediate_size: int = 5120,
        num_hidden_layers: int = 20,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 4,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        use_qkv_bias: bool = False,
        use_bias: bool = False,
        use_qk_norm: bool = True,
        rms_norm_eps: float = 1e-6,
        tie_word_embeddings: bool = False,
        initializer_range: float = 0.006,
        max_position_embeddings: int = 32768,
        rope_theta: float = 600000.0,
        rope_scaling: dict[str, Any] | None = None,
        partial_rotary_factor: float = 0.5,
        rotary_dim: int | None = None,
        num_experts: int | None = 256,
        num_experts_per_tok: int = 8,
        num_shared_experts: int | None = 1,
        moe_intermediate_size: int = 512,
        first_k_dense_replace: int = 1,
        n_group: int = 8,
        topk_group: int = 4,
        routed_scaling_factor: float = 2.5,
        norm_topk_prob: bool = True,
        score_function: str = "sigmoid",
        moe_router_enable_expert_bias: bool = True,
        router_dtype: str | None = "fp32",
        attention_dropout: float = 0.0,
        use_cache: bool = False,
        pad_token_id: int | None = DEFAULT_EOS_TOKEN_ID,
        eos_token_id: int | list[int] | None = DEFAULT_EOS_TOKEN_ID,
        bos_token_id: int | None = None,
        mask_token_id: int = DEFAULT_MASK_TOKEN_ID,
        **kwargs: Any,
    ) -> None:
        # transformers 5.x turns a ``rope_scaling`` attribute into ``rope_parameters`` (with a
        # deprecation warning); the checkpoints write ``null`` there and nothing else is
        # supported, so it is checked and not stored.
        _check_rope_scaling(rope_scaling)
        declared = kwargs.pop("model_type", MODEL_TYPE)
        if declared not in ACCEPTED_MODEL_TYPES:
            raise LLaDA2ConfigError(
                f"config.json declares model_type {declared!r}: this is not a LLaDA2-MoE checkpoint "
                f"({MODEL_TYPE!r}); pin the preset of its own family instead"
            )
        kwargs.update(
            pad_token_id=pad_token_id,
            eos_token_id=eos_token_id,
            bos_token_id=bos_token_id,
            tie_word_embeddings=tie_word_embeddings,
        )
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.use_qkv_bias = use_qkv_bias
        self.use_bias = use_bias
        self.use_qk_norm = use_qk_norm
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = float(rope_theta)
        self.partial_rotary_factor = float(partial_rotary_factor)
        self.rotary_dim = rotary_dim
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.num_shared_experts = num_shared_experts
        self.moe_intermediate_size = moe_intermediate_size
        self.first_k_dense_replace = first_k_dense_replace
        self.n_group = n_group
        self.topk_group = topk_group
        self.routed_scaling_factor = float(routed_scaling_factor)
        self.norm_topk_prob = norm_topk_prob
        self.score_function = score_function
        self.moe_router_enable_expert_bias = moe_router_enable_expert_bias
        self.router_dtype = router_dtype
        self.attention_dropout = attention_dropout
        self.use_cache = use_cache
        self.mask_token_id = mask_token_id
        self.validate_llada2()

    @property
    def rotary_dims(self) -> int:
        """How many leading dims of each head are rotated (``head_dim * partial_rotary_factor``)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, layer_idx: int) -> bool:
        return bool(self.num_experts) and layer_idx >= self.first_k_dense_replace

    def validate_llada2(self) -> None:
        """Refuse what would silently compute something else than the published model."""
        check_layer_count(self.num_hidden_layers)
        rot = self.rotary_dims
        if rot < 2 or rot % 2 or rot > self.head_dim:
            raise LLaDA2ConfigError(
                f"partial_rotary_factor {self.partial_rotary_factor} gives {rot} rotary dims of "
                f"head_dim {self.head_dim}: it must be an even number in [2, head_dim]"
            )
        if self.rotary_dim is not None and int(self.rotary_dim) != rot:
            raise LLaDA2ConfigError(
                f"rotary_dim {self.rotary_dim} disagrees with head_dim * partial_rotary_factor = {rot}: "
                "fix one of them in config.json"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise LLaDA2ConfigError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if getattr(self, "norm_head", False):
            raise LLaDA2ConfigError("norm_head: true is not supported by this modeling")
        if not self.num_experts:
            return
        if self.score_function != "sigmoid":
            raise LLaDA2ConfigError(
                f"score_function {self.score_function!r} is not supported: LLaDA2's router is 'sigmoid'"
            )
        if self.num_experts % self.n_group:
            raise LLaDA2ConfigError(
                f"num_experts {self.num_experts} is not divisible by n_group {self.n_group}"
            )
        per_group = self.num_experts // self.n_group
        if not 1 <= self.topk_group <= self.n_group or per_group < 2:
            raise LLaDA2ConfigError(
                f"topk_group {self.topk_group} must be in [1, n_group={self.n_group}] and each group "
                f"needs >= 2 experts (has {per_group}): the group score sums each group's top 2"
            )
        if not 1 <= self.num_experts_per_tok <= per_group * self.topk_group:
            raise LLaDA2ConfigError(
                f"num_experts_per_tok {self.num_experts_per_tok} must be in [1, "
                f"{per_group * self.topk_group}] (experts in the {self.topk_group} selected groups)"
            )


def _check_rope_scaling(value: Any) -> None:
    if value is None:
        return
    kind = value.get("rope_type", value.get("type")) if isinstance(value, dict) else value
    if kind in (None, "default"):
        return
    raise LLaDA2ConfigError(
        f"rope_scaling {value!r} is not supported (the LLaDA2 checkpoints use null): remove it"
    )


__all__ = [
    "DEFAULT_EOS_TOKEN_ID",
    "DEFAULT_MASK_TOKEN_ID",
    "MAX_LAYERS",
    "MODEL_TYPE",
    "LLaDA2ConfigError",
    "LLaDA2MoeConfig",
    "check_layer_count",
]
