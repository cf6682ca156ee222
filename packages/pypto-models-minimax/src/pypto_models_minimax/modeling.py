"""MiniMax M2.7 and M3 (text backbone) on transformers' native classes.

Nothing is vendored: :class:`PyptoMiniMaxM27ForCausalLM` *is* ``MiniMaxM2ForCausalLM`` and
:class:`PyptoMiniMaxM3ForCausalLM` *is* ``MiniMaxM3VLForCausalLM`` (same modules, same
forward), with these differences:

* loading (``from_pretrained``) reads the released checkpoints strictly and converts the
  FP8 release on load (:mod:`pypto_models_minimax.loading`);
* M3's sparse-attention layers use :class:`PyptoMiniMaxM3Attention`: the lightning
  indexer's keys travel in the layer's KV cache as one extra key head, instead of a
  separate ``update_index`` buffer that only transformers' own cache layers have. Any cache
  that stores what ``update`` is given (transformers' dynamic and static caches,
  pypto-capture's capture-safe ring buffers) therefore keeps them. The indexer itself is
  the installed transformers' own (its selection rule changed between 5.12 and 5.24), fed
  the history through a small adapter; against a static cache it is fixed-shape and
  device-only: scores over every slot, future slots at ``-inf``, max-pooled blocks, the
  local block forced in with ``scatter_``, ``topk`` over a constant number of blocks, no
  host reads. The extra head costs exactly what the native index-key buffer costs when
  ``index_head_dim == head_dim`` (the release: 128 and 128; smaller index dims are
  zero-padded).

Routing stays the native router; pypto-capture's ``apply_exact_moe`` (the bench graph arm's
default) makes the experts capture-safe without changing the outputs.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from transformers import GenerationMixin
from transformers.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2ForCausalLM
from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as m3

from pypto_common.checkpoint import split_load_options

from .checks import check_config_dict
from .configuration import PyptoMiniMaxM3Config, PyptoMiniMaxM27Config
from .errors import MiniMaxConfigError, MiniMaxWeightsError
from .loading import LoadReport, load_checkpoint

log = logging.getLogger(__name__)

__all__ = [
    "PyptoMiniMaxM3Attention",
    "PyptoMiniMaxM3ForCausalLM",
    "PyptoMiniMaxM27ForCausalLM",
]

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


# --- M3: the capture-safe sparse attention ------------------------------------------------


def _cache_kwarg(cls: Any) -> str:
    """transformers 5.24 calls the cache ``cache``; 5.12 ``past_key_values``."""
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


# Decided once at import: the traced forward must not inspect signatures.
_ATTN_CACHE_KW = _cache_kwarg(m3.MiniMaxM3VLAttention)


class _IndexKeysInCache:
    """What the native indexer sees as its cache (``cache.layers[i].update_index(idx_k)``).

    ``update_index`` packs the layer's keys and this step's index key into one tensor (the
    index key as one extra head), writes it with the real cache's ordinary ``update`` and
    hands the indexer the index-key history back; the attention then takes its own keys
    and values from here. The indexer's selection math stays the installed transformers'
    own (it changed between 5.12 and 5.24: one selection for all heads vs one per head).
    """

    def __init__(
        self, cache: Any, layer_idx: int, key: torch.Tensor, value: torch.Tensor, index_dim: int
    ) -> None:
        self.cache = cache
        self.layer_idx = layer_idx
        self.key = key
        self.value = value
        self.index_dim = index_dim
        self.layers = self  # the indexer indexes ``layers[layer_idx]``

    def __getitem__(self, index: int) -> _IndexKeysInCache:
        return self

    def update_index(self, idx_k: torch.Tensor) -> torch.Tensor:
        heads = self.key.shape[1]
        packed = torch.cat([self.key, _pad_last(idx_k, self.key.shape[-1])], dim=1)
        packed, self.value = self.cache.update(packed, self.value, self.layer_idx)
        self.key = packed[:, :heads]
        return packed[:, heads:, :, : self.index_dim]


class PyptoMiniMaxM3Attention(m3.MiniMaxM3VLAttention):
    """M3 attention whose indexer keys ride in the KV cache (see the module docstring)."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: Any = None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        cache = cache if cache is not None else past_key_values
        if self.indexer is None:  # dense-attention layer: the native forward as it is
            parent = cast(Callable[..., Any], super().forward)
            return parent(
                hidden_states,
                position_embeddings,
                attention_mask,
                **{_ATTN_CACHE_KW: cache},
                **kwargs,
            )
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        key = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query, key = m3.apply_rotary_pos_emb(query, key, cos, sin)

        indexer = self.indexer
        shim = (
            _IndexKeysInCache(cache, self.layer_idx, key, value, int(indexer.head_dim))
            if cache is not None
            else None
        )
        position_ids = kwargs.get("position_ids")
        if position_ids is None:  # the decoder always passes them; a layer called alone may not
            past = cache.get_seq_length() if cache is not None else 0  # a device tensor: no sync
            position_ids = torch.arange(query.shape[2], device=query.device) + past
        position_ids = (
            position_ids if position_ids.ndim > 1 else position_ids.unsqueeze(0)
        ).expand(query.shape[0], -1)
        block_indices = indexer(hidden_states, position_embeddings, shim, position_ids)
        if shim is not None:
            key, value = shim.key, shim.value
        if self.config._attn_implementation in ("eager", "sdpa"):
            attention_mask = indexer.build_block_mask(
                block_indices, attention_mask, key.shape[2], query.dtype, query.device, position_ids
            )
        interface: Callable[..., Any] = m3.ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, m3.eager_attention_forward
        )
        out, weights = interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            block_indices=block_indices,
            **kwargs,
        )
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out), weights


def _pad_last(x: torch.Tensor, size: int) -> torch.Tensor:
    if x.shape[-1] == size:
        return x
    return F.pad(x, (0, size - x.shape[-1]))


def _install_m3_sparse_attention(model: torch.nn.Module) -> int:
    """Re-class every attention module; returns how many have an indexer (sparse layers)."""
    n = 0
    for module in model.modules():
        if type(module) is m3.MiniMaxM3VLAttention:
            module.__class__ = PyptoMiniMaxM3Attention
            n += module.indexer is not None
    return n


# --- loading ------------------------------------------------------------------------------


def _requested_dtype(kwargs: dict[str, Any], config: Any, quantized: bool) -> torch.dtype:
    value = kwargs.pop("dtype", None)
    legacy = kwargs.pop("torch_dtype", None)
    value = value if value is not None else legacy
    if isinstance(value, torch.dtype):
        return value
    if value not in (None, "auto"):
        if value not in _DTYPES:
            raise MiniMaxConfigError(
                f"dtype {value!r} is not one of {', '.join(_DTYPES)} or 'auto'"
            )
        return _DTYPES[str(value)]
    # "auto": the checkpoint's own dtype; the FP8 release's unquantised dtype is bfloat16.
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(stored, torch.dtype):
        return stored
    if isinstance(stored, str) and stored in _DTYPES:
        return _DTYPES[stored]
    return torch.bfloat16 if quantized else torch.float32


def _block_of(config: Any) -> tuple[int, int]:
    quant = getattr(config, "checkpoint_quantization", None) or {}
    block = quant.get("weight_block_size", [128, 128]) if isinstance(quant, dict) else [128, 128]
    return int(block[0]), int(block[1])


def _rebuild_computed_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Modules whose buffers are computed in ``__init__`` (rotary frequencies) and were
    built on the meta device are built again for real."""
    for name, module in list(model.named_modules()):
        meta = [b for b in module.buffers(recurse=False) if b.is_meta]
        if not meta:
            continue
        fresh = type(module)(config=model.config).to(device)
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, fresh)
    leftover = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if leftover:
        raise MiniMaxWeightsError(
            f"{leftover[0]} was not loaded (and {len(leftover) - 1} more): report this to "
            "pypto-models-minimax with the checkpoint's config.json"
        )


def _load(cls: Any, family: str, path: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if args:
        raise MiniMaxConfigError(
            f"{cls.__name__}.from_pretrained takes the folder and keyword options only"
        )
    folder = Path(os.fspath(path)).expanduser()
    if not folder.is_dir():
        raise MiniMaxConfigError(
            f"{folder} is not a local model folder: download it first (pypto-download) and pin "
            f"it with the {family} preset"
        )
    opts = split_load_options(kwargs)
    if opts.unsupported:
        raise MiniMaxConfigError(
            f"from_pretrained option(s) {', '.join(opts.unsupported)} are not supported by the "
            f"pinned {family} loader: drop them (it loads a local folder onto the CPU; move "
            "the model afterwards)"
        )
    config = opts.config
    if config is None:
        config = cls.config_class.from_pretrained(str(folder))
    elif not isinstance(config, cls.config_class):
        check_config_dict(config.to_dict() if hasattr(config, "to_dict") else config, family)
        config = cls.config_class.from_dict(config.to_dict())
    quantized = getattr(config, "checkpoint_quantization", None) is not None
    dtype = _requested_dtype(opts.dtype, config, quantized)
    if opts.attn_implementation is not None:
        config._attn_implementation = opts.attn_implementation
    if opts.experts_implementation is not None:
        config._experts_implementation = opts.experts_implementation
    with torch.device("meta"):
        model = cls(config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    state, report = load_checkpoint(
        folder,
        family,
        expected,
        num_hidden_layers=int(config.num_hidden_layers),
        num_experts=int(config.num_local_experts),
        dtype=dtype,
        block=_block_of(config),
    )
    model.load_state_dict(state, strict=True, assign=True)
    _rebuild_computed_buffers(model, torch.device("cpu"))
    model.config.dtype = dtype
    _load_generation_config(model, folder)
    model.eval()
    _log_report(family, report, dtype)
    model.pypto_load_report = report
    if opts.device_map not in (None, "cpu"):
        model.to(opts.device_map if isinstance(opts.device_map, (str, torch.device)) else "cpu")
    if opts.output_loading_info:
        return model, {
            "missing_keys": [],
            "unexpected_keys": [],
            "mismatched_keys": [],
            "error_msgs": [],
        }
    return model


def _load_generation_config(model: Any, folder: Path) -> None:
    if not (folder / "generation_config.json").is_file():
        return
    from transformers import GenerationConfig

    try:
        model.generation_config = GenerationConfig.from_pretrained(str(folder))
    except Exception as err:  # a broken generation config must not hide the model
        log.warning("generation_config.json not used: %s", " ".join(str(err).split())[:200])


def _log_report(family: str, report: LoadReport, dtype: torch.dtype) -> None:
    name = str(dtype).replace("torch.", "")
    if report.dequantized:
        b = report.block or (128, 128)
        log.info(
            "%s: %d FP8 e4m3 matrices dequantised from %dx%d blocks to %s",
            family,
            report.dequantized,
            b[0],
            b[1],
            name,
        )
    if report.mtp_tensors:
        log.info(
            "%s: %d multi-token-prediction (MTP) tensors skipped: decoding does not use them",
            family,
            report.mtp_tensors,
        )
    if report.vision_tensors:
        log.info(
            "%s: %d vision tower / projector tensors skipped: text backbone only",
            family,
            report.vision_tensors,
        )


# --- the model classes --------------------------------------------------------------------


# GenerationMixin is named directly in every class's bases: transformers otherwise wraps a
# remote-code class in a look-alike subclass, and the loaded model would not be an instance
# of the class auto_map names.
class PyptoMiniMaxM27ForCausalLM(MiniMaxM2ForCausalLM, GenerationMixin):
    """MiniMax-M2.7 on the native M2 classes, loaded strictly (FP8 dequantised on load)."""

    config_class = PyptoMiniMaxM27Config
    pypto_model_family = "minimax_m27"
    pypto_load_report: LoadReport | None = None

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        return _load(cls, "minimax_m27", pretrained_model_name_or_path, args, kwargs)


class PyptoMiniMaxM3ForCausalLM(m3.MiniMaxM3VLForCausalLM, GenerationMixin):
    """MiniMax-M3's text backbone (out of the VL checkpoint) with capture-safe sparse
    attention; loaded strictly."""

    config_class = PyptoMiniMaxM3Config
    pypto_model_family = "minimax_m3"
    pypto_load_report: LoadReport | None = None

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.pypto_sparse_layers = _install_m3_sparse_attention(self)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        return _load(cls, "minimax_m3", pretrained_model_name_or_path, args, kwargs)
