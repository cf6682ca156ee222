"""LLaDA2-MoE modeling for transformers 5.8-5.24, loading the published checkpoints unchanged.

The checkpoint's own remote code no longer imports on transformers 5.x (it needs
``modeling_attn_mask_utils`` and the ``"default"`` rope initialiser, both gone). This is a
fresh implementation of the same network, built from transformers' stable pieces (the
RMSNorm, the attention interface, ``PreTrainedModel``'s loader):

* attention: one fused ``query_key_value`` projection, per-head RMS qk-norm, rotary on the
  first ``head_dim * partial_rotary_factor`` dims, output ``dense``; never causal: the caller
  passes a 4-D mask (block-causal for block diffusion), and without one the model builds
  the block-causal mask itself (the published code raises on a plain ``model(ids)``);
* MoE layers (``layer >= first_k_dense_replace``): sigmoid router in fp32 with
  ``expert_bias`` used for the choice only, group-limited top-k (``n_group`` groups scored
  by their top-2 sum, ``topk_group`` kept), normalised and scaled by
  ``routed_scaling_factor``; routed experts plus one shared MLP. The combine is the
  published one: the k expert outputs weighted in fp32 in top-k order, summed, cast back;
* experts are stored fused (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``, the
  layout of transformers' own MoE classes and of pypto-capture's exact MoE); the
  checkpoint's per-expert ``experts.N.{gate,up,down}_proj.weight`` names are merged at
  load and split again at save by transformers' own Qwen2-MoE conversion rules.

The experts run one of three exact schedules: eagerly, the published per-expert loop (it
reads the per-expert counts on the host: not capturable); while a graph is captured or
compiled, fixed shapes with no host read: a gather (each (token, slot) pair's expert
weights picked with ``index_select`` and applied with ``bmm``; on a CPU, and on an
accelerator when a call routes fewer pairs than there are experts), else a dense pass
(every expert over every token in two batched matmuls, then each pair's output picked),
which reads each expert once instead of once per pair. The combine is the published one
on every schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutput, MoeCausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaRMSNorm, eager_attention_forward

from .configuration import MODEL_TYPE, LLaDA2MoeConfig
from .generation import block_diffusion_generate, steps_per_block_for
from .masks import DEFAULT_BLOCK_LENGTH, additive_mask, block_causal_allowed, prepare_mask

# --- layers ---------------------------------------------------------------------------


class LLaDA2MoeRMSNorm(LlamaRMSNorm):
    """transformers' Llama RMSNorm: the same arithmetic as the published LLaDA2 norm."""


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_partial_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first ``cos.shape[-1]`` dims of each head; pass the rest through."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rot = cos.shape[-1]
    q_rot, q_pass = q[..., :rot], q[..., rot:]
    k_rot, k_pass = k[..., :rot], k[..., rot:]
    q_embed = torch.cat(((q_rot * cos) + (rotate_half(q_rot) * sin), q_pass), dim=-1)
    k_embed = torch.cat(((k_rot * cos) + (rotate_half(k_rot) * sin), k_pass), dim=-1)
    return q_embed, k_embed


class LLaDA2MoeRotaryEmbedding(nn.Module):
    """Plain RoPE over the rotary dims (theta = ``rope_theta``), cos/sin computed in fp32.

    ``inv_freq`` is a non-persistent buffer: transformers 5.x's loader leaves such buffers
    uninitialised unless ``_init_weights`` recreates them, which the pretrained class does
    through :meth:`compute_default_rope_parameters` (the hook name 5.x also looks for).
    """

    inv_freq: torch.Tensor
    original_inv_freq: torch.Tensor

    def __init__(self, config: LLaDA2MoeConfig, device: torch.device | None = None) -> None:
        super().__init__()
        self.config = config
        self.rope_type = "default"
        self.attention_scaling = 1.0
        inv_freq, _ = self.compute_default_rope_parameters(config, device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)

    @staticmethod
    def compute_default_rope_parameters(
        config: LLaDA2MoeConfig, device: torch.device | None = None, **_: Any
    ) -> tuple[torch.Tensor, float]:
        dim = config.rotary_dims
        exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
        return 1.0 / (config.rope_theta**exponents), 1.0

    @torch.no_grad()
    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(x.device, torch.float32)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class LLaDA2MoeMLP(nn.Module):
    def __init__(self, config: LLaDA2MoeConfig, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LLaDA2MoeAttention(nn.Module):
    def __init__(self, config: LLaDA2MoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = False
        self.query_key_value = nn.Linear(
            config.hidden_size,
            (self.num_heads + 2 * self.num_key_value_heads) * self.head_dim,
            bias=config.use_qkv_bias,
        )
        if config.use_qk_norm:
            self.query_layernorm = LLaDA2MoeRMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.key_layernorm = LLaDA2MoeRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.dense = nn.Linear(
            self.num_heads * self.head_dim, config.hidden_size, bias=config.use_bias
        )

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: Any = None,
    ) -> torch.Tensor:
        bsz, q_len, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states).view(
            bsz, q_len, self.num_heads + 2 * self.num_key_value_heads, self.head_dim
        )
        q, k, v = qkv.split(
            [self.num_heads, self.num_key_value_heads, self.num_key_value_heads], dim=2
        )
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.config.use_qk_norm:
            q = self.query_layernorm(q)
            k = self.key_layernorm(k)
        cos, sin = position_embeddings
        q, k = apply_partial_rotary(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        impl = getattr(self.config, "_attn_implementation", None) or "eager"
        interface: Callable[..., Any] = eager_attention_forward
        if impl != "eager":
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            interface = ALL_ATTENTION_FUNCTIONS[impl]
        out, _ = interface(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
        )
        return self.dense(out.reshape(bsz, q_len, -1).contiguous())


class LLaDA2MoeGate(nn.Module):
    """The router: fp32 sigmoid scores, ``expert_bias`` for the choice, group-limited top-k.

    Every step stays on the device (two ``topk`` and a ``scatter``): nothing is read back
    on the host, so the router captures as is.
    """

    expert_bias: torch.Tensor

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__()
        assert config.num_experts is not None
        self.top_k = config.num_experts_per_tok
        self.num_experts = config.num_experts
        self.n_group = config.n_group
        self.topk_group = config.topk_group
        self.norm_topk_prob = config.norm_topk_prob
        self.routed_scaling_factor = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(self.num_experts, config.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(self.num_experts))

    def forward(
        self, hidden_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden [T, H] -> (top-k expert ids [T, k], fp32 weights [T, k], fp32 logits [T, E])."""
        logits = F.linear(hidden_states.float(), self.weight.float())
        scores = torch.sigmoid(logits)
        choice = scores + self.expert_bias.float()
        tokens = choice.shape[0]
        group_scores = choice.view(tokens, self.n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
        expert_mask = (
            group_mask.unsqueeze(-1)
            .expand(tokens, self.n_group, self.num_experts // self.n_group)
            .reshape(tokens, -1)
        )
        choice = choice.masked_fill(~expert_mask.bool(), float("-inf"))
        topk_idx = torch.topk(choice, k=self.top_k, dim=-1)[1]
        weights = scores.gather(1, topk_idx)
        if self.top_k > 1 and self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return topk_idx, weights * self.routed_scaling_factor, logits


def _capturing() -> bool:
    """True while torch.compile traces or a CUDA / NPU stream is being captured."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and compiler.is_compiling():
        return True
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return True
    probe = getattr(getattr(torch, "npu", None), "is_current_stream_capturing", None)
    if callable(probe):
        try:
            return bool(probe())
        except Exception:  # no NPU initialised: not capturing
            return False
    return False


class LLaDA2MoeExperts(nn.Module):
    """The routed experts, fused: ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``.

    ``schedule`` picks how they run: ``"auto"`` (the loop eagerly; while a graph is captured
    or compiled, the gather on a CPU or for fewer routed pairs than experts, else the dense
    pass),
    ``"loop"``, ``"gather"`` or ``"dense"``. All are exact: each (token, slot) pair goes
    through its own expert; they differ in how the matrix products are grouped (and the
    dense pass also computes, then drops, the pairs nobody routed).
    """

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__()
        assert config.num_experts is not None
        self.num_experts = config.num_experts
        self.intermediate_size = config.moe_intermediate_size
        hidden = config.hidden_size
        self.gate_up_proj = nn.Parameter(
            torch.empty(self.num_experts, 2 * self.intermediate_size, hidden)
        )
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, self.intermediate_size))
        self.act_fn = ACT2FN[config.hidden_act]
        self.schedule = "auto"

    def _activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up

    def _loop(self, hidden: torch.Tensor, top_k_index: torch.Tensor) -> torch.Tensor:
        """The published ``moe_infer``: tokens sorted by expert, one matmul per used expert."""
        k = top_k_index.shape[-1]
        flat = top_k_index.reshape(-1)
        order = flat.argsort()
        sorted_tokens = hidden[order // k]
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()  # host read
        outs = []
        start = 0
        for expert, n in enumerate(counts):
            if n == 0:
                continue
            rows = sorted_tokens[start : start + n]
            h = self._activate(F.linear(rows, self.gate_up_proj[expert]))
            outs.append(F.linear(h, self.down_proj[expert]))
            start += n
        out = torch.cat(outs, dim=0)
        unsorted = torch.empty_like(out)
        unsorted[order] = out
        return unsorted

    def _gather(self, hidden: torch.Tensor, top_k_index: torch.Tensor) -> torch.Tensor:
        """Fixed shapes: every pair's expert weights gathered on the device, then ``bmm``."""
        k = top_k_index.shape[-1]
        ids = top_k_index.reshape(-1)
        rows = hidden.repeat_interleave(k, dim=0).unsqueeze(-1)
        h = torch.bmm(self.gate_up_proj.index_select(0, ids), rows).squeeze(-1)
        h = self._activate(h).unsqueeze(-1)
        return torch.bmm(self.down_proj.index_select(0, ids), h).squeeze(-1)

    def _dense(self, hidden: torch.Tensor, top_k_index: torch.Tensor) -> torch.Tensor:
        """Fixed shapes: every expert over every token (two batched matmuls), pairs picked."""
        tokens, k = top_k_index.shape
        up = torch.matmul(hidden.unsqueeze(0), self.gate_up_proj.transpose(1, 2))  # [E, T, 2I]
        out = torch.matmul(self._activate(up), self.down_proj.transpose(1, 2))  # [E, T, H]
        token = torch.arange(tokens, device=hidden.device).unsqueeze(-1).expand(tokens, k)
        return out[top_k_index, token].reshape(tokens * k, -1)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """hidden [T, H], expert ids [T, k], fp32 weights [T, k] -> [T, H]."""
        tokens, k = top_k_index.shape
        schedule = self.schedule
        if schedule == "auto":
            if not _capturing():
                schedule = "loop"
            elif hidden_states.device.type == "cpu" or tokens * k < self.num_experts:
                # Compiled on a CPU the gather fuses into one kernel reading each routed
                # pair's weights once; it beats the dense pass (num_experts / top_k times the
                # FLOPs) at every token count. On an accelerator the dense pass wins once the
                # routed pairs outnumber the experts (it reads each expert once).
                schedule = "gather"
            else:
                schedule = "dense"
        run = {"loop": self._loop, "gather": self._gather, "dense": self._dense}[schedule]
        per_pair = run(hidden_states, top_k_index)
        # The published combine: pair outputs in fp32, weighted, summed in top-k order.
        weighted = per_pair.view(tokens, k, -1).float() * top_k_weights.unsqueeze(-1).float()
        return weighted.sum(dim=1).to(hidden_states.dtype)


class LLaDA2MoeSparseMoeBlock(nn.Module):
    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__()
        self.gate = LLaDA2MoeGate(config)
        self.experts = LLaDA2MoeExperts(config)
        self.shared_experts = (
            LLaDA2MoeMLP(config, config.moe_intermediate_size * config.num_shared_experts)
            if config.num_shared_experts
            else None
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        bsz, seq, hidden = hidden_states.shape
        flat = hidden_states.reshape(-1, hidden)
        topk_idx, topk_weight, _ = self.gate(flat)
        out = self.experts(flat, topk_idx, topk_weight).view(bsz, seq, hidden)
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden_states)
        return out


class LLaDA2MoeDecoderLayer(nn.Module):
    def __init__(self, config: LLaDA2MoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention = LLaDA2MoeAttention(config, layer_idx)
        self.mlp: nn.Module = (
            LLaDA2MoeSparseMoeBlock(config)
            if config.is_moe_layer(layer_idx)
            else LLaDA2MoeMLP(config, config.intermediate_size)
        )
        self.input_layernorm = LLaDA2MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LLaDA2MoeRMSNorm(
            config.hidden_size, eps=config.rms_norm_eps
        )

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache: Any = None,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.attention(
            self.input_layernorm(hidden_states), position_embeddings, attention_mask, cache
        )
        hidden_states = residual + hidden_states
        residual = hidden_states
        return residual + self.mlp(self.post_attention_layernorm(hidden_states))


# --- models ---------------------------------------------------------------------------


class LLaDA2CheckpointError(ValueError):
    """The folder's weights do not cover the model: one line naming what is missing."""


class LLaDA2MoePreTrainedModel(PreTrainedModel):
    config_class = LLaDA2MoeConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["LLaDA2MoeDecoderLayer"]  # noqa: RUF012  (transformers reads a list)
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flex_attn = False

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        """transformers' loader, refusing a checkpoint that lacks weights.

        transformers fills missing weights with fresh random ones and only logs it: a
        truncated download would then generate noise with a throughput figure attached.
        Here it is an error naming the first missing tensor.
        """
        want_info = bool(kwargs.pop("output_loading_info", False))
        loaded: Any = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        model, info = loaded
        missing = sorted(info.get("missing_keys") or ())
        if missing:
            where = args[0] if args else kwargs.get("pretrained_model_name_or_path", "the folder")
            raise LLaDA2CheckpointError(
                f"{where} lacks {len(missing)} weight tensor(s) of this LLaDA2-MoE config, first "
                f"{missing[0]}: the checkpoint is incomplete or for another size; re-download it"
            )
        return (model, info) if want_info else model

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Everything transformers' default does not know: fused experts, the router, RoPE."""
        super()._init_weights(module)
        std = float(getattr(self.config, "initializer_range", 0.02) or 0.02)
        if isinstance(module, LLaDA2MoeExperts):
            nn.init.normal_(module.gate_up_proj, mean=0.0, std=std)
            nn.init.normal_(module.down_proj, mean=0.0, std=std)
        elif isinstance(module, LLaDA2MoeGate):
            nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            nn.init.zeros_(module.expert_bias)
        elif isinstance(module, LLaDA2MoeRotaryEmbedding):
            inv_freq, _ = module.compute_default_rope_parameters(
                module.config, module.inv_freq.device
            )
            module.inv_freq.copy_(inv_freq)
            module.original_inv_freq.copy_(inv_freq)


class LLaDA2MoeModel(LLaDA2MoePreTrainedModel):
    """The decoder stack (checkpoint prefix ``model.``)."""

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__(config)
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, config.pad_token_id
        )
        self.layers = nn.ModuleList(
            [LLaDA2MoeDecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        self.norm = LLaDA2MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LLaDA2MoeRotaryEmbedding(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.word_embeddings

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.word_embeddings = value  # type: ignore[assignment]

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        block_length: int | None = None,
        **kwargs: Any,
    ) -> BaseModelOutput:
        """Hidden states for ``input_ids`` (see :func:`~pypto_models_llada2.masks.prepare_mask` for the masks accepted).

        ``cache`` (or the older name ``past_key_values``): a block KV cache from
        :mod:`pypto_models_llada2.generation` that this call writes its keys/values into.
        """
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            assert input_ids is not None
            inputs_embeds = self.word_embeddings(input_ids)
        bsz, q_len = inputs_embeds.shape[:2]
        if position_ids is None:
            position_ids = torch.arange(q_len, device=inputs_embeds.device).unsqueeze(0)
        k_len = cache.max_len if cache is not None else q_len
        mask = prepare_mask(
            attention_mask,
            batch=bsz,
            q_len=q_len,
            k_len=k_len,
            position_ids=position_ids,
            block_length=block_length or DEFAULT_BLOCK_LENGTH,
            dtype=inputs_embeds.dtype,
        )
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings, mask, cache)
        return BaseModelOutput(last_hidden_state=self.norm(hidden_states))


class LLaDA2MoeModelLM(LLaDA2MoePreTrainedModel):
    """LLaDA2-MoE with its LM head, and the published block-diffusion generation.

    ``generate`` keeps the published signature and return value (the generated tokens up
    to and including the first EOS); ``diffusion_generate`` is pypto-bench's
    diffusion-generate protocol. Both run :mod:`pypto_models_llada2.generation`.
    """

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__(config)
        self.model = LLaDA2MoeModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.model.word_embeddings

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.word_embeddings = value

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        self.lm_head = new_embeddings

    def get_decoder(self) -> LLaDA2MoeModel:
        return self.model

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        block_length: int | None = None,
        **kwargs: Any,
    ) -> MoeCausalLMOutputWithPast:
        kwargs.pop("use_cache", None)  # no transformers cache: pass a block KV cache as ``cache``
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            block_length=block_length,
            **kwargs,
        )
        hidden = out.last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return MoeCausalLMOutputWithPast(logits=self.lm_head(hidden))

    @torch.no_grad()
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        temperature: float = 0.0,
        block_length: int = DEFAULT_BLOCK_LENGTH,
        steps: int = 32,
        gen_length: int = 2048,
        top_p: float | None = None,
        top_k: int | None = None,
        eos_early_stop: bool = True,
        minimal_topk: int = 1,
        threshold: float = 0.95,
        eos_id: int | None = None,
        mask_id: int | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """The published entry point: generated ids up to and including the first EOS.

        ``steps`` is per block, as published. Also accepts ``input_ids`` for ``inputs`` and
        ``max_new_tokens`` for ``gen_length``; extra keywords (``use_cache``, ``seed``,
        ``generator``, ``step_backend``) go to :func:`~pypto_models_llada2.generation.block_diffusion_generate`.
        Rows of a batch are right-padded with the pad id to the longest answer.
        """
        if inputs is None:
            inputs = kwargs.pop("input_ids", None)
        if inputs is None:
            raise ValueError("generate() needs the prompt ids as `inputs` (or `input_ids`)")
        gen_length = int(kwargs.pop("max_new_tokens", gen_length))
        for name in ("attention_mask", "do_sample", "pad_token_id"):
            kwargs.pop(name, None)
        if top_p is not None or top_k is not None:
            raise ValueError("top_p/top_k sampling is not supported: pass temperature only")
        out = block_diffusion_generate(
            self,
            inputs,
            gen_length=gen_length,
            block_length=block_length,
            steps_per_block=steps,
            threshold=threshold,
            minimal_topk=minimal_topk,
            temperature=temperature,
            eos_early_stop=eos_early_stop,
            eos_id=eos_id,
            mask_id=mask_id,
            **kwargs,
        )
        return out.answer(pad_id=self.config.pad_token_id)

    @torch.no_grad()
    def diffusion_generate(
        self,
        input_ids: torch.Tensor,
        *,
        gen_length: int,
        steps: int | None = None,
        block_length: int | None = None,
        forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
        step_backend: Any = None,
        ignore_eos: bool = False,
        step_observer: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
        **kwargs: Any,
    ) -> Any:
        """pypto-bench's diffusion-generate protocol (``steps`` = the whole generation's budget).

        ``steps`` is spread evenly over the generated blocks (the published ``steps`` is per
        block: the protocol's default of one step per position gives the published default of
        ``block_length`` steps per block). ``forward`` is not used: every step of this model is
        a one-block forward against the block KV cache, which ``step_backend`` (a
        pypto-capture graph backend or its name) captures once; the answer's ``path`` says
        which ran. ``ignore_eos`` generates every block (no stop after the EOS block).
        ``step_observer(canvas, logits)`` sees every denoising step (the numerical gate's
        hook; see :func:`~pypto_models_llada2.generation.block_diffusion_generate`).
        """
        block_length = int(block_length or DEFAULT_BLOCK_LENGTH)
        per_block = steps_per_block_for(int(input_ids.shape[1]), gen_length, block_length, steps)
        return block_diffusion_generate(
            self,
            input_ids,
            gen_length=gen_length,
            block_length=block_length,
            steps_per_block=per_block,
            eos_early_stop=not ignore_eos,
            step_backend=step_backend,
            step_observer=step_observer,
            **kwargs,
        )


def _register_weight_layout() -> None:
    """Per-expert checkpoint names <-> fused experts: transformers' own Qwen2-MoE rules.

    transformers 5.x merges ``mlp.experts.N.{gate,up}_proj.weight`` into
    ``mlp.experts.gate_up_proj`` (and ``down_proj``) at load and splits them at save; it
    looks the rules up by class name first, so both LLaDA2 classes get them.
    """
    from transformers import conversion_mapping as cm

    get = cm.get_checkpoint_conversion_mapping
    register = cm.register_checkpoint_conversion_mapping
    rules = get("qwen2_moe")
    if rules is None:  # pragma: no cover - every supported transformers has them
        raise RuntimeError("this transformers has no Qwen2-MoE conversion rules to merge experts")
    for name in (LLaDA2MoeModelLM.__name__, LLaDA2MoeModel.__name__, MODEL_TYPE):
        if get(name) is None:
            register(name, get("qwen2_moe"))


def register_auto_classes() -> None:
    """Map model_type ``llada2_moe`` in the Auto classes and the weight layout (idempotent).

    A locally registered model_type wins over a folder's ``auto_map``, so once this package
    is imported the checkpoints load without running any folder code.
    """
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    _register_weight_layout()
    try:
        AutoConfig.register(MODEL_TYPE, LLaDA2MoeConfig)
    except ValueError:
        pass  # already registered
    for auto, cls in ((AutoModel, LLaDA2MoeModel), (AutoModelForCausalLM, LLaDA2MoeModelLM)):
        try:
            auto.register(LLaDA2MoeConfig, cls)
        except ValueError:
            pass


__all__ = [
    "DEFAULT_BLOCK_LENGTH",
    "LLaDA2CheckpointError",
    "LLaDA2MoeAttention",
    "LLaDA2MoeConfig",
    "LLaDA2MoeDecoderLayer",
    "LLaDA2MoeExperts",
    "LLaDA2MoeGate",
    "LLaDA2MoeMLP",
    "LLaDA2MoeModel",
    "LLaDA2MoeModelLM",
    "LLaDA2MoePreTrainedModel",
    "LLaDA2MoeRMSNorm",
    "LLaDA2MoeRotaryEmbedding",
    "LLaDA2MoeSparseMoeBlock",
    "additive_mask",
    "apply_partial_rotary",
    "block_causal_allowed",
    "register_auto_classes",
]
