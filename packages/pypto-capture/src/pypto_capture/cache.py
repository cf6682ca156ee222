"""A capture-safe KV cache for transformers 5.8-5.24 decoder models.

Why not transformers' own ``StaticCache``? Its full-attention ``StaticLayer`` is close
(fixed buffers, ``index_copy_`` at a tensor ``cumulative_length``), but
``StaticSlidingWindowLayer`` tracks its fill level in a Python int
(``cumulative_length_int``) and branches on it (roll once the window is full). A replayed
graph freezes that int and that branch, and under torch.compile every step changes a
guarded Python value and recompiles; its ``get_mask_sizes`` depends on the same int. So
sliding-window models (gemma3, mistral, qwen2 with sliding windows) cannot replay it, on
5.8 or 5.24. We therefore keep transformers' *interface* (we subclass its ``Cache`` and
``CacheLayerMixin``, so model code calls ``update`` exactly as usual) but own the state:

- every layer is a fixed ring buffer ``[B, kv_heads, L_i, head_dim]`` sized from the
  real prefill keys, so layers may differ in heads, head_dim and length
  (``L_i = min(window_i, max_cache_len)`` for sliding layers, ``max_cache_len`` else);
- one device-side write position ``write_pos`` (shape [1], long) shared by all layers;
  ``update`` is ``index_copy_(2, write_pos % L_i, k)``: no host work, no Python state;
- the decode attention mask is computed *on the device* from ``write_pos`` and the
  prompt's padding (``decode_masks``); it is passed to the model as a prebuilt 4D
  additive mask, which transformers' mask API returns as is;
- the caller advances ``write_pos`` in place (``advance()``) between replays.

Ring slots are safe for attention because rotary embeddings are applied before caching:
key order does not matter, only which slots the mask lets through. A model that reads key
positions off the cache instead (Inkling's relative-position bias takes
``arange(kv_length) + kv_offset`` from ``get_mask_sizes``) gets a per-slot offset from a
sliding layer, so every slot reads as the position it holds.

Layers that *consume* another layer's keys/values (KV sharing, e.g. Gemma 3n / Gemma 4's
``num_kv_shared_layers``: transformers 5.24 gives them a ``DummyLayer`` without tensors,
5.8 leaves them out of the prefill cache) hold no ring at all: they read the ring of the
last producing layer of their type, which the model passes along itself, and the mask of
their layer type is the producer's. Sliding windows come from the prefill cache's layers
and, where a layer there reports none (transformers 5.8 builds Gemma 4's prefill cache from
plain full layers), from ``config.layer_types`` / ``config.sliding_window``.

Layers that keep sparse-attention indexer keys (DeepSeek-V3.2-style DSA: GLM-MoE-DSA,
HY-V4; transformers' ``DynamicIndexedLayer`` / ``StaticIndexedLayer``, whose
``update_indexer`` takes ``[B, S, index_head_dim]`` keys and returns every cached one) hold
a second buffer ``[B, L_i, index_head_dim]`` beside their ring, written at the same slots
as the keys and returned whole, as transformers' static layer does: the indexer adds the
layer's attention mask to its scores, so slots the mask hides are never selected. A model
that also keeps a growing history of indexer positions (``indexer_position_ids``,
Qwen4-exp, which re-rotates every cached key each step) cannot be held at a fixed shape and
is refused in one line.

Recurrent layers (Gated DeltaNet / KDA linear attention, Mamba / Mamba2 SSMs, LFM2's short
convolutions: transformers 5.x ``LinearAttentionLayer``) keep no sequence axis at all: a
conv state ``[B, channels, kernel]`` and a recurrent state of fixed shape (``[B, heads,
k_dim, v_dim]`` for the delta rule, ``[B, heads, head_dim, d_state]`` for Mamba2), which
transformers' own layer already updates in place (``copy_``) once ``has_previous_state``
is set. Such a layer here is *that* class (the installed version's, so its update rules and
state layout are transformers' own) adopting clones of the prefill's states at fixed
addresses, with ``has_previous_state`` set and past recording off: the decode branch the
model takes is then fixed, and nothing in it is host work. Layers that run attention and a
recurrent mixer in parallel (layer types ``hybrid`` / ``hybrid_sliding``, e.g. Falcon-H1,
Zamba2) hold both a ring and the states. Layers with no mixer state (Nemotron-H's MoE and
MLP blocks) hold nothing. Masks are handed out under every name a model reads: its layer
types, ``full_attention`` / ``sliding_attention`` for hybrid layers, and ``None`` for
recurrent layers (a generated token is never padding, which is what transformers' own
``create_recurrent_attention_mask`` returns for a one-token step).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, cast

import torch

from .errors import CacheApiNotSupportedError, UnsupportedModelError

log = logging.getLogger(__name__)

__all__ = [
    "LAYER_KINDS",
    "capture_safe_cache_class",
    "check_cache_fits",
    "indexer_layers",
    "layer_kinds_of",
    "make_capture_safe_cache",
    "static_cache_bytes",
]

#: What a capture-safe cache layer holds: ``attention`` a K/V ring, ``indexed`` a K/V ring
#: and the sparse-attention indexer's keys at the same slots, ``state`` conv and recurrent
#: states, ``hybrid`` a ring and states, ``shared`` nothing (reads another layer's ring: KV
#: sharing), ``none`` nothing (a block without sequence state, e.g. an MLP-only layer).
LAYER_KINDS = ("attention", "indexed", "state", "hybrid", "shared", "none")

_CLASSES: dict[str, type] = {}

#: The layer's own state, set in __init__ or on first write: a read before that is a plain
#: AttributeError (a probe), never "the model calls an API we lack".
_PLAIN_MISSING = frozenset(
    {
        "keys", "values", "device", "dtype", "is_initialized", "indexer_keys",
        "indexer_position_ids", "max_batch_size", "max_cache_len", "sliding_window",
        "is_sliding", "write_pos", "holds_cache", "offsets",
    }
)  # fmt: skip


def _layer_window(layer: Any) -> int | None:
    win = getattr(layer, "sliding_window", None)
    return int(win) if isinstance(win, int) and win > 0 else None


def capture_safe_cache_class() -> type:
    """The ``CaptureSafeCache`` class, built on first use (imports transformers lazily)."""
    if "cache" in _CLASSES:
        return _CLASSES["cache"]
    from transformers.cache_utils import Cache, CacheLayerMixin

    class CaptureSafeLayer(CacheLayerMixin):
        """One layer's ring buffer, written at the shared device-side position."""

        is_compileable = True
        is_croppable = False
        # Narrower than the mixin's ``Tensor | None``: update() initialises them first.
        keys: torch.Tensor
        values: torch.Tensor

        def __init__(
            self,
            cache_len: int,
            window: int | None,
            write_pos: torch.Tensor,
            holds_cache: bool = True,
        ):
            super().__init__()
            self.max_cache_len = cache_len
            self.sliding_window = window
            self.is_sliding = window is not None
            self.write_pos = write_pos
            # False for a KV-sharing consumer: no buffers, never written (see module docstring).
            self.holds_cache = holds_cache
            if not holds_cache:
                self.keys = cast(Any, None)
                self.values = cast(Any, None)
                self.is_initialized = True

        def __getattr__(self, name: str) -> Any:
            # Reached only for a name the layer lacks: a cache API newer than this class
            # (DeepSeek-V4's store_compression_weights, ...) is refused in one line, not an
            # AttributeError deep in the model (it still is one, for hasattr()).
            if name.startswith("_") or name in _PLAIN_MISSING:
                raise AttributeError(name)
            raise CacheApiNotSupportedError(
                f"the model calls `{name}` on its cache layer, which pypto-capture's "
                "capture-safe cache does not implement (a cache kind this version does not "
                "know): its graph arm cannot hold that state; run the eager arm"
            )

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            # Only reached when update() runs before load_prefill(): an eager call, never a capture.
            b, h = key_states.shape[:2]
            self.device = key_states.device
            self.keys = key_states.new_zeros((b, h, self.max_cache_len, key_states.shape[-1]))
            self.values = value_states.new_zeros(
                (b, value_states.shape[1], self.max_cache_len, value_states.shape[-1])
            )
            self.is_initialized = True

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ):
            if not self.holds_cache:
                raise UnsupportedModelError(
                    "a layer that shares another layer's keys/values tried to write the cache; "
                    "this model's KV sharing is not the kind pypto-capture supports"
                )
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            idx = self._slots(key_states.shape[-2])
            self.keys.index_copy_(2, idx, key_states)
            self.values.index_copy_(2, idx, value_states)
            return self.keys, self.values

        def _slots(self, n: int) -> torch.Tensor:
            """Ring indices of the ``n`` tokens written at the device position (an eager
            multi-token write must not wrap the ring: ``n <= L_i``)."""
            if n == 1:
                return torch.remainder(self.write_pos, self.max_cache_len)
            return torch.remainder(
                self.write_pos + torch.arange(n, device=self.write_pos.device), self.max_cache_len
            )

        def get_mask_sizes(self, query_length: int, *args: Any) -> tuple[int, Any]:
            """(slots, offset): slot ``k`` holds position ``k + offset``. A full layer's
            ring never wraps (offset 0); a sliding layer's does, so its offset is per slot,
            a device tensor ``[L]``: ``a_k - k`` for the absolute position ``a_k`` slot
            ``k`` holds at the current write position (as :meth:`decode_masks` computes).
            Models that read positions off the cache (Inkling's relative-position bias:
            ``arange(kv_length) + kv_offset``) then see each key's own position, whatever
            the ring's order; a prebuilt mask never reaches here."""
            n = self.max_cache_len
            if not self.is_sliding:
                return n, 0
            c = self.write_pos
            k = torch.arange(n, device=c.device)
            return n, (c - torch.remainder(c - k, n)) - k

        def get_seq_length(self) -> Any:
            # A 0-d device tensor (like StaticLayer) so reading it never syncs the host.
            return self.write_pos[0]

        def get_max_length(self) -> int:
            return self.max_cache_len

        def nbytes(self) -> int:
            """Bytes of this layer's key and value buffers (0 before they exist, or when shared)."""
            if not self.holds_cache or not self.is_initialized or self.keys is None:
                return 0
            return int(
                self.keys.numel() * self.keys.element_size()
                + self.values.numel() * self.values.element_size()
            )

        def get_max_cache_shape(self) -> int:  # transformers < 5.2x name
            return self.max_cache_len

        def reset(self) -> None:
            # Buffers are left as they are: every slot is rewritten before the mask exposes it.
            pass

    class CaptureSafeIndexedLayer(CaptureSafeLayer):
        """A ring plus the sparse-attention indexer's keys ``[B, L_i, index_head_dim]``,
        written at the ring's slots (see the module docstring)."""

        def __init__(self, cache_len: int, window: int | None, write_pos: torch.Tensor):
            super().__init__(cache_len, window, write_pos)
            self.indexer_keys: torch.Tensor | None = None
            # Read by models that keep indexer positions; refused at load_prefill when set.
            self.indexer_position_ids: torch.Tensor | None = None

        def update_indexer(self, indexer_key_states: torch.Tensor) -> torch.Tensor:
            """Write the step's indexer keys at the ring's slots; every slot's, as
            transformers' ``StaticIndexedLayer`` returns them (the mask hides the rest)."""
            if self.indexer_keys is None:  # an eager call before load_prefill, never a capture
                b, _, d = indexer_key_states.shape
                self.indexer_keys = indexer_key_states.new_zeros((b, self.max_cache_len, d))
            n = indexer_key_states.shape[1]
            self.indexer_keys.index_copy_(1, self._slots(n), indexer_key_states)
            return self.indexer_keys

        def load_indexer(self, src: Any, idx: torch.Tensor, layer: int) -> None:
            """Copy a prefill layer's indexer keys into the slots ``idx`` its keys went to."""
            if getattr(src, "indexer_position_ids", None) is not None:
                raise UnsupportedModelError(
                    f"layer {layer} keeps a growing history of indexer positions "
                    "(indexer_position_ids: every cached indexer key is re-rotated each step), "
                    "which a fixed-shape captured step cannot hold; run this model's eager arm"
                )
            k = getattr(src, "indexer_keys", None)
            if not isinstance(k, torch.Tensor) or k.dim() != 3 or k.shape[0] != self.keys.shape[0]:
                raise UnsupportedModelError(
                    f"prefill cache layer {layer} ({type(src).__name__}) holds no [B, S, D] "
                    "indexer keys; this model's sparse-attention cache is not supported"
                )
            d = k.shape[-1]
            if self.indexer_keys is None or self.indexer_keys.shape != (
                k.shape[0],
                self.max_cache_len,
                d,
            ):
                self.indexer_keys = k.new_zeros((k.shape[0], self.max_cache_len, d))
                _mark_static(self.indexer_keys)
            n = int(idx.numel())
            if k.shape[1] < n:
                raise UnsupportedModelError(
                    f"prefill cache layer {layer} holds {k.shape[1]} indexer keys for {n} "
                    "cached keys; this model's sparse-attention cache is not supported"
                )
            self.indexer_keys.index_copy_(1, idx, k[:, -n:].to(self.indexer_keys.dtype))

        def indexer_nbytes(self) -> int:
            t = self.indexer_keys
            return 0 if t is None else int(t.numel() * t.element_size())

        def nbytes(self) -> int:
            return super().nbytes() + self.indexer_nbytes()

    linear_base = _linear_layer_base()

    class CaptureSafeNoStateLayer:
        """A layer that keeps nothing across steps (an MLP / MoE-only block)."""

        holds_cache = False
        holds_state = False
        is_compileable = True
        is_sliding = False
        keys = None
        values = None

        def nbytes(self) -> int:
            return 0

        def state_tensors(self) -> list[torch.Tensor]:
            return []

        def reset(self) -> None:
            pass

        def get_max_length(self) -> int:
            return -1

    if linear_base is not None:

        class CaptureSafeStateLayer(linear_base):  # type: ignore[misc, valid-type]
            """transformers' own ``LinearAttentionLayer`` holding fixed-address clones of the
            prefill's conv / recurrent states, decode branch fixed (see the module docstring)."""

            holds_cache = False
            holds_state = True

            def adopt_states(self, src: Any) -> None:
                """Take the prefill layer's states and flags. The first prompt allocates the
                buffers (clones, static addresses); later prompts copy into them in place, so
                a captured step, which holds these addresses, reads the new prompt's state."""
                # Every attribute the prefill layer keeps for its states (5.8 sets some, e.g.
                # conv_kernel_size, only when a state first arrives), minus the attention
                # ring's own (a hybrid layer keeps its ring).
                ring = set(vars(self)) - set(_linear_attrs(linear_base))
                for name in set(vars(src)) | set(_linear_attrs(linear_base)):
                    if name in ring or name in _RING_ATTRS or not hasattr(src, name):
                        continue
                    setattr(self, name, _adopt(getattr(self, name, None), getattr(src, name)))
                if hasattr(self, "record_past"):
                    self.record_past = False
                flags = getattr(self, "has_previous_state", None)
                if isinstance(flags, dict):
                    for k in flags:
                        flags[k] = True
                else:
                    self.has_previous_state = True
                _mark_static(*self.state_tensors())

            def state_tensors(self) -> list[torch.Tensor]:
                out: list[torch.Tensor] = []
                for name in ("conv_states", "recurrent_states"):
                    value = getattr(self, name, None)
                    values = value.values() if isinstance(value, dict) else [value]
                    out += [v for v in values if isinstance(v, torch.Tensor)]
                return out

            def state_shapes(self) -> dict[str, list[list[int]]]:
                shapes: dict[str, list[list[int]]] = {}
                for name in ("conv_states", "recurrent_states"):
                    value = getattr(self, name, None)
                    values = value.values() if isinstance(value, dict) else [value]
                    got = [list(v.shape) for v in values if isinstance(v, torch.Tensor)]
                    if got:
                        shapes[name.removesuffix("s")] = got
                return shapes

            def state_nbytes(self) -> int:
                return sum(t.numel() * t.element_size() for t in self.state_tensors())

            def nbytes(self) -> int:
                return self.state_nbytes()

            def reset(self) -> None:
                # Every state is overwritten by the next load_prefill; zeroing it (the mixin's
                # reset) would also clear has_previous_state and change the decode branch.
                pass

        class CaptureSafeHybridLayer(CaptureSafeLayer, CaptureSafeStateLayer):
            """Attention ring and recurrent states in one layer (``hybrid`` layer types)."""

            holds_state = True

            def __init__(self, cache_len: int, window: int | None, write_pos: torch.Tensor):
                CaptureSafeLayer.__init__(self, cache_len, window, write_pos)
                fresh = cast(type, linear_base)()
                for name in _linear_attrs(linear_base):
                    if name not in ("device", "dtype"):
                        setattr(self, name, getattr(fresh, name))

            def nbytes(self) -> int:
                return CaptureSafeLayer.nbytes(self) + self.state_nbytes()

            def reset(self) -> None:
                pass

    class CaptureSafeCache(Cache):
        """Fixed ring buffers + one device-side position; see the module docstring."""

        def __init__(
            self,
            *,
            batch_size: int,
            max_cache_len: int,
            windows: list[int | None],
            layer_types: list[str],
            device: torch.device,
            shared: list[bool] | None = None,
            kinds: list[str] | None = None,
        ):
            self.write_pos = torch.zeros(1, dtype=torch.long, device=device)
            shared = list(shared) if shared is not None else [False] * len(windows)
            if len(shared) != len(windows):
                raise UnsupportedModelError(
                    f"{len(shared)} KV-sharing flags for {len(windows)} layers; pass one per layer"
                )
            if kinds is None:
                kinds = ["shared" if s else "attention" for s in shared]
            if len(kinds) != len(windows) or any(k not in LAYER_KINDS for k in kinds):
                raise UnsupportedModelError(
                    f"layer kinds {kinds!r} do not give one of {LAYER_KINDS} per layer "
                    f"({len(windows)} layers)"
                )
            if linear_base is None and any(k in ("state", "hybrid") for k in kinds):
                raise UnsupportedModelError(
                    "this model has recurrent (linear-attention / SSM / conv) layers but the "
                    "installed transformers has no LinearAttentionLayer cache; install "
                    "transformers>=5.8"
                )
            self.kinds = list(kinds)
            layers: list[Any] = []
            for w, kind in zip(windows, kinds, strict=True):
                length = min(w, max_cache_len) if w else max_cache_len
                if kind == "attention":
                    layers.append(CaptureSafeLayer(length, w, self.write_pos))
                elif kind == "indexed":
                    layers.append(CaptureSafeIndexedLayer(length, w, self.write_pos))
                elif kind == "shared":
                    layers.append(CaptureSafeLayer(length, w, self.write_pos, holds_cache=False))
                elif kind == "state":
                    layers.append(CaptureSafeStateLayer())
                elif kind == "hybrid":
                    layers.append(CaptureSafeHybridLayer(length, w, self.write_pos))
                else:
                    layers.append(CaptureSafeNoStateLayer())
            super().__init__(layers=layers)
            self.batch_size_ = batch_size
            self.capacity = max_cache_len  # not max_cache_len: a read-only property of Cache in 5.8
            self.layer_types = list(layer_types)
            self.device = device
            # Padding of the prompt, per slot, and the left-pad count per row: decode
            # positions and masks are computed from these on the device.
            self.kv_valid = torch.ones(batch_size, max_cache_len, dtype=torch.bool, device=device)
            self.pos_offset = torch.zeros(batch_size, dtype=torch.long, device=device)
            self._aranges: dict[int, torch.Tensor] = {}
            lengths: dict[str, int] = {}
            for t, layer in zip(self.layer_types, layers, strict=True):
                if not layer.holds_cache:
                    continue  # reads its producer's ring under the producer's mask
                if lengths.setdefault(t, layer.max_cache_len) != layer.max_cache_len:
                    raise UnsupportedModelError(
                        f"layers of type {t!r} have different cache lengths; one mask per layer type "
                        "cannot serve them (report this model to pypto-capture)"
                    )
            for t, kind in zip(self.layer_types, self.kinds, strict=True):
                if kind == "shared" and t not in lengths:
                    raise UnsupportedModelError(
                        f"a layer of type {t!r} shares keys/values but no layer of that type holds "
                        "a cache to share; this model's KV sharing is not supported"
                    )
            # Recurrent layer types read no mask at decode (None, as transformers' own
            # create_recurrent_attention_mask returns for a one-token step).
            self.state_types = sorted(
                {t for t, k in zip(self.layer_types, self.kinds, strict=True) if k == "state"}
                - set(lengths)
            )
            self.type_lengths = lengths
            for n in set(lengths.values()):
                self._aranges[n] = torch.arange(n, device=device)

        # -- host-side (eager) operations ---------------------------------------
        def load_prefill(self, prefilled: Any, attention_mask: torch.Tensor) -> None:
            """Copy the keys/values of an eager prefill (a DynamicCache) into the rings.

            ``attention_mask`` is the prompt's 2D mask (left padding); slot ``s`` of the
            prompt goes to ring index ``s % L_i``. Sliding layers of a DynamicCache hold
            only the last ``window - 1`` tokens, which is all a later query can see.
            """
            p = attention_mask.shape[1]
            if p >= self.capacity:
                raise UnsupportedModelError(
                    f"prompt of {p} tokens does not fit max_cache_len={self.capacity}; raise max_cache_len"
                )
            src_layers = getattr(prefilled, "layers", None)
            if src_layers is None or len(src_layers) > len(self.layers):
                raise UnsupportedModelError(
                    "the prefill cache has no per-layer tensors matching the model's layers "
                    f"({type(prefilled).__name__}); this model's cache layout is not supported"
                )
            rings = cast("list[CaptureSafeLayer]", self.layers)  # built in __init__
            for i, (dst, kind) in enumerate(zip(rings, self.kinds, strict=True)):
                src = src_layers[i] if i < len(src_layers) else None
                if kind in ("state", "hybrid"):
                    if not _has_states(src):
                        raise UnsupportedModelError(
                            f"layer {i} is recurrent but the prefill cache holds no conv or "
                            f"recurrent state there ({type(src).__name__}); this model's cache "
                            "layout is not supported"
                        )
                    cast(Any, dst).adopt_states(src)
                    if kind == "state":
                        continue
                elif kind == "none":
                    continue
                k = getattr(src, "keys", None)
                v = getattr(src, "values", None)
                if not dst.holds_cache:
                    if k is not None:
                        raise UnsupportedModelError(
                            f"layer {i} should share another layer's keys/values but the prefill "
                            "cached its own; this model's KV sharing is not supported"
                        )
                    continue
                if k is None or v is None or k.dim() != 4:
                    raise UnsupportedModelError(
                        f"prefill cache layer {i} ({type(src).__name__}) holds no 4D keys; "
                        "this model's cache layout is not supported"
                    )
                if (
                    dst.keys is None
                    or dst.keys.shape[:2] != k.shape[:2]
                    or dst.keys.shape[-1] != k.shape[-1]
                    or dst.values.shape[1] != v.shape[1]
                    or dst.values.shape[-1] != v.shape[-1]
                ):
                    dst.keys = k.new_zeros((k.shape[0], k.shape[1], dst.max_cache_len, k.shape[-1]))
                    dst.values = v.new_zeros(
                        (v.shape[0], v.shape[1], dst.max_cache_len, v.shape[-1])
                    )
                    dst.device = k.device
                    dst.is_initialized = True
                    _mark_static(dst.keys, dst.values)
                n = k.shape[-2]
                if n > dst.max_cache_len:
                    k, v, n = (
                        k[:, :, -dst.max_cache_len :],
                        v[:, :, -dst.max_cache_len :],
                        dst.max_cache_len,
                    )
                idx = torch.remainder(torch.arange(p - n, p, device=k.device), dst.max_cache_len)
                dst.keys.index_copy_(2, idx, k.to(dst.keys.dtype))
                dst.values.index_copy_(2, idx, v.to(dst.values.dtype))
                if kind == "indexed":
                    cast(Any, dst).load_indexer(src, idx, i)
            am = attention_mask.to(device=self.device, dtype=torch.bool)
            self.kv_valid.fill_(True)
            self.kv_valid[:, :p].copy_(am)
            self.pos_offset.copy_(p - am.long().sum(-1))
            self.write_pos.fill_(p)
            _mark_static(self.write_pos, self.kv_valid, self.pos_offset)

        def seq_length(self) -> int:
            """Tokens written so far (prompt + decoded), read on the host: syncs; not for capture."""
            return int(self.write_pos.item())

        def describe(self) -> dict[str, Any]:
            """Per-layer slots, heads and bytes, the layer-type pattern and the total.

            What a report prints next to its memory figure: sliding layers hold ``window``
            slots, full layers ``max_cache_len``, KV-sharing consumers nothing.
            """
            from .layout import layer_pattern

            rings = cast("list[CaptureSafeLayer]", self.layers)
            layers = []
            for i, (t, layer) in enumerate(zip(self.layer_types, rings, strict=True)):
                kind = self.kinds[i]
                entry: dict[str, Any] = {
                    "index": i,
                    "type": t,
                    "kind": kind,
                    "shared": kind == "shared",
                }
                if kind in ("state", "hybrid"):
                    state = cast(Any, layer)
                    entry["states"] = state.state_shapes()
                    entry["state_bytes"] = state.state_nbytes()
                    entry["bytes"] = state.state_nbytes()
                if kind in ("none", "state"):
                    entry.setdefault("bytes", 0)
                if layer.holds_cache:
                    entry["slots"] = layer.max_cache_len
                    if layer.is_initialized and layer.keys is not None:
                        entry["kv_heads"] = int(layer.keys.shape[1])
                        entry["head_dim"] = int(layer.keys.shape[-1])
                        entry["value_head_dim"] = int(layer.values.shape[-1])
                    entry["kv_bytes"] = CaptureSafeLayer.nbytes(layer)
                    entry["bytes"] = layer.nbytes()
                if kind == "indexed":
                    indexed = cast(Any, layer)
                    entry["indexer_bytes"] = indexed.indexer_nbytes()
                    if indexed.indexer_keys is not None:
                        entry["index_head_dim"] = int(indexed.indexer_keys.shape[-1])
                layers.append(entry)
            state_bytes = self.state_nbytes()
            indexer_bytes = self.indexer_nbytes()
            return {
                "pattern": layer_pattern(self.layer_types),
                "max_cache_len": self.capacity,
                "batch_size": self.batch_size_,
                "slots_per_type": dict(self.type_lengths),
                "kinds": {k: self.kinds.count(k) for k in LAYER_KINDS if k in self.kinds},
                "layers": layers,
                "kv_bytes": self.nbytes() - state_bytes - indexer_bytes,
                "state_bytes": state_bytes,
                "indexer_bytes": indexer_bytes,
                "total_bytes": self.nbytes(),
            }

        def nbytes(self) -> int:
            """Bytes held by every layer: key/value rings plus conv and recurrent states."""
            return sum(layer.nbytes() for layer in cast("list[Any]", self.layers))

        def state_nbytes(self) -> int:
            """Bytes of the conv and recurrent states alone (read and written every step)."""
            return sum(
                cast(Any, layer).state_nbytes()
                for layer, kind in zip(self.layers, self.kinds, strict=True)
                if kind in ("state", "hybrid")
            )

        def indexer_nbytes(self) -> int:
            """Bytes of the sparse-attention indexer keys (``indexed`` layers)."""
            return sum(
                cast(Any, layer).indexer_nbytes()
                for layer, kind in zip(self.layers, self.kinds, strict=True)
                if kind == "indexed"
            )

        def state_tensors(self) -> list[torch.Tensor]:
            """Every tensor a decode step writes: the position, rings, indexer keys and
            recurrent states (what a capture snapshots and restores around its warm-up)."""
            tensors = [self.write_pos]
            for layer, kind in zip(self.layers, self.kinds, strict=True):
                keys = getattr(layer, "keys", None)
                if kind in ("attention", "indexed", "hybrid") and keys is not None:
                    tensors += [keys, cast(Any, layer).values]
                indexer = getattr(layer, "indexer_keys", None)
                if kind == "indexed" and indexer is not None:
                    tensors.append(indexer)
                if kind in ("state", "hybrid"):
                    tensors += cast(Any, layer).state_tensors()
            return tensors

        # -- what the model reads from a cache, answered without host state ---------
        def get_seq_length(self, layer_idx: int = 0) -> Any:
            """Tokens written so far as a 0-d device tensor, whatever the layer kind (a
            recurrent-only model asks too, and transformers' Cache would raise there)."""
            return self.write_pos[0]

        def get_mask_sizes(self, query_length: int, layer_idx: int = 0, *args: Any) -> Any:
            layer = self.layers[layer_idx] if layer_idx < len(self.layers) else None
            if getattr(layer, "holds_cache", False):
                return cast(Any, layer).get_mask_sizes(query_length)
            for other in self.layers:
                if getattr(other, "holds_cache", False):
                    return cast(Any, other).get_mask_sizes(query_length)
            return query_length, 0

        def reset(self) -> None:
            self.write_pos.zero_()
            self.kv_valid.fill_(True)
            self.pos_offset.zero_()

        # -- device-side (capturable) operations ----------------------------------
        def advance(self, n: int = 1) -> None:
            """Move the write position forward in place (a device op, no host sync)."""
            self.write_pos.add_(n)

        def decode_position_ids(self) -> torch.Tensor:
            """[B, 1] rotary positions of the token being written (prompt padding excluded)."""
            return (self.write_pos - self.pos_offset).unsqueeze(-1)

        def decode_masks(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
            """4D additive masks ``[B, 1, 1, L]`` per layer type for a one-token query.

            Ring index ``k`` holds absolute slot ``a_k = c - ((c - k) mod L)`` for the current
            slot ``c``; it is visible when ``a_k >= 0`` and that slot was not prompt padding.
            """
            c = self.write_pos
            lo = torch.finfo(dtype).min
            out: dict[str, torch.Tensor] = {}
            by_len: dict[int, torch.Tensor] = {}
            for t, n in self.type_lengths.items():
                if n not in by_len:
                    k = self._aranges[n]
                    absolute = c - torch.remainder(c - k, n)
                    valid = (absolute >= 0) & torch.gather(
                        self.kv_valid,
                        1,
                        absolute.clamp(min=0).unsqueeze(0).expand(self.kv_valid.shape[0], n),
                    )
                    zero = torch.zeros((), dtype=dtype, device=valid.device)
                    neg = torch.full((), lo, dtype=dtype, device=valid.device)
                    by_len[n] = torch.where(valid, zero, neg)[:, None, None, :]
                out[t] = by_len[n]
            return self._mask_aliases(out)

        def _mask_aliases(self, masks: dict[str, Any]) -> dict[str, Any]:
            """Add the names a model reads that are not its layer types: hybrid layers'
            attention reads ``full_attention`` / ``sliding_attention`` (Falcon-H1), and a
            recurrent layer type (or ``linear_attention``, the Mamba mask) reads None."""
            for alias, source in (
                ("full_attention", "hybrid"),
                ("sliding_attention", "hybrid_sliding"),
            ):
                if alias not in masks and source in masks:
                    masks[alias] = masks[source]
            for t in self.state_types:
                masks.setdefault(t, None)
            if any(k in ("state", "hybrid") for k in self.kinds):
                masks.setdefault("linear_attention", None)
            return masks

        def decode_mask(self, dtype: torch.dtype) -> Any:
            """The one mask for a model whose forward takes a single mask: the attention
            layers' (they share one length, checked by the runner), or None when no layer
            attends (a pure SSM reads no mask at decode)."""
            for mask in self.decode_masks(dtype).values():
                if mask is not None:
                    return mask
            return None

    _CLASSES["cache"] = CaptureSafeCache
    _CLASSES["layer"] = CaptureSafeLayer
    return CaptureSafeCache


def _mark_static(*tensors: torch.Tensor) -> None:
    """Tell dynamo these buffers keep their address (needed for cudagraph trees)."""
    mark = getattr(getattr(torch, "_dynamo", None), "mark_static_address", None)
    if mark is None:
        return
    for t in tensors:
        try:
            mark(t)
        except Exception:  # pragma: no cover - older torch may refuse some tensors
            log.debug("mark_static_address refused a tensor", exc_info=True)


def _linear_layer_base() -> type | None:
    """transformers' ``LinearAttentionLayer`` (5.x), or None where it does not exist."""
    try:
        from transformers.cache_utils import LinearAttentionLayer
    except ImportError:  # pragma: no cover - every supported version has it
        return None
    return cast(type, LinearAttentionLayer)


@functools.lru_cache(maxsize=4)
def _linear_attrs(base: type) -> tuple[str, ...]:
    """The per-instance attributes of the installed ``LinearAttentionLayer`` (5.8 keeps one
    tensor per state, 5.2x a dict of ``number_of_states``): read from a fresh instance, so
    the copy follows whatever the installed version keeps."""
    return tuple(vars(base()))


#: Attention-side attributes of transformers' hybrid prefill layers that a capture-safe
#: layer owns itself (its ring replaces them).
_RING_ATTRS = frozenset(
    {
        "keys",
        "values",
        "is_initialized",
        "cumulative_length",
        "cumulative_length_int",
        "sliding_window",
    }
)


def _adopt(mine: Any, theirs: Any) -> Any:
    """``theirs`` (a prefill layer's attribute) as this layer's value: tensors are copied
    into ``mine`` in place where shapes and dtypes agree (the address a graph holds stays),
    cloned otherwise; dicts of states key by key; flags and sizes as they are."""
    if isinstance(theirs, torch.Tensor):
        if (
            isinstance(mine, torch.Tensor)
            and mine.shape == theirs.shape
            and mine.dtype == theirs.dtype
            and mine.device == theirs.device
        ):
            mine.copy_(theirs)
            return mine
        return theirs.detach().clone()
    if isinstance(theirs, dict):
        old = mine if isinstance(mine, dict) else {}
        return {k: _adopt(old.get(k), v) for k, v in theirs.items()}
    return theirs


def _has_states(layer: Any) -> bool:
    for name in ("conv_states", "recurrent_states"):
        value = getattr(layer, name, None)
        values = value.values() if isinstance(value, dict) else [value]
        if any(isinstance(v, torch.Tensor) for v in values):
            return True
    return False


def _is_linear_layer(layer: Any) -> bool:
    try:
        from transformers.cache_utils import LinearAttentionCacheLayerMixin
    except ImportError:  # pragma: no cover
        return False
    return isinstance(layer, LinearAttentionCacheLayerMixin)


def layer_kinds_of(prefilled: Any, consumers: list[bool]) -> list[str]:
    """What each layer of an eager prefill cache holds, as one of ``LAYER_KINDS``.

    A linear-attention layer that is also an attention layer is ``hybrid``; an attention
    layer whose prefill wrote sparse-attention indexer keys is ``indexed``; a layer without
    keys (transformers' ``DummyLayer``, or absent) is a KV-sharing consumer when the config
    says so and a stateless block (``none``) otherwise.
    """
    from transformers.cache_utils import CacheLayerMixin

    src_layers = list(getattr(prefilled, "layers", None) or [])
    kinds = []
    for i, consumer in enumerate(consumers):
        src = src_layers[i] if i < len(src_layers) else None
        if _is_linear_layer(src) and (_has_states(src) or isinstance(src, CacheLayerMixin)):
            kinds.append("hybrid" if isinstance(src, CacheLayerMixin) else "state")
        elif _is_linear_layer(src):
            kinds.append("none")  # 5.8 gives MLP / MoE blocks an empty linear layer
        elif src is not None and getattr(src, "keys", None) is not None:
            indexer = getattr(src, "indexer_keys", None)
            held = isinstance(indexer, torch.Tensor) and indexer.numel() > 0
            held = held or getattr(src, "indexer_position_ids", None) is not None
            kinds.append("indexed" if held else "attention")
        elif consumer:
            kinds.append("shared")
        elif src is None and i >= len(src_layers) and not any(consumers):
            kinds.append("shared")  # 5.8 leaves KV consumers out of the prefill cache
        else:
            kinds.append("none")
    return kinds


def _layer_types_of(config: Any, n_layers: int) -> list[str]:
    types_ = getattr(config, "layer_types", None)
    if isinstance(types_, (list, tuple)) and len(types_) >= n_layers:
        return [str(t) for t in types_[:n_layers]]
    return ["full_attention"] * n_layers


def _config_kv_consumers(config: Any, n_layers: int) -> list[bool]:
    """Which layers reuse another layer's keys/values, from the config alone.

    transformers >= 5.2x exposes ``kv_sharing_modes`` ("reuse" marks a consumer); before
    that, Gemma 3n / Gemma 4 configs say ``num_kv_shared_layers``: the last N layers.
    """
    modes = getattr(config, "kv_sharing_modes", None)
    if isinstance(modes, (list, tuple)) and len(modes) == n_layers:
        return [m == "reuse" for m in modes]
    shared = getattr(config, "num_kv_shared_layers", None)
    if isinstance(shared, int) and 0 < shared <= n_layers:
        return [i >= n_layers - shared for i in range(n_layers)]
    return [False] * n_layers


def make_capture_safe_cache(
    model: Any,
    *,
    batch_size: int,
    max_cache_len: int,
    device: torch.device,
    prefilled: Any | None = None,
) -> Any:
    """Build a ``CaptureSafeCache`` for ``model``.

    Per-layer windows come from the layers of an eager prefill cache when given (what
    transformers itself decided for this model), else, and for any layer there that
    reports none, from ``config.layer_types`` and ``config.sliding_window``. Layers that
    share another layer's keys/values (a prefill layer without tensors, or absent, or
    marked by the config) get no ring.
    """
    config = getattr(model, "config", model)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_layers = int(text_config.num_hidden_layers)
    layer_types = _layer_types_of(text_config, n_layers)
    win = getattr(text_config, "sliding_window", None)
    config_windows = [
        int(win) if ("sliding" in t and isinstance(win, int) and win > 0) else None
        for t in layer_types
    ]
    consumers = _config_kv_consumers(text_config, n_layers)
    src_layers = getattr(prefilled, "layers", None) if prefilled is not None else None
    if src_layers is not None and len(src_layers) > n_layers:
        # Dory's looped layers: its forward appends a copy of each looped layer's cache per
        # loop to the cache it is handed (when that cache has one layer per decoder layer),
        # inside the captured step, where the copies would hold the wrong loop's keys.
        raise UnsupportedModelError(
            f"{type(model).__name__}'s own prefill cache holds {len(src_layers)} layers for its "
            f"{n_layers} decoder layers: the model adds cache layers of its own while it runs "
            "(looped layers that keep a copy per loop), which a capture-safe cache of one "
            "layer per decoder layer cannot hold: bench its eager arm"
        )
    if src_layers is not None and 0 < len(src_layers) <= n_layers:
        windows = []
        for i in range(n_layers):
            src = src_layers[i] if i < len(src_layers) else None
            windows.append(_layer_window(src) or config_windows[i])
        kinds = layer_kinds_of(prefilled, consumers)
    else:
        windows = config_windows
        kinds = ["shared" if c else "attention" for c in consumers]
    cls = capture_safe_cache_class()
    return cls(
        batch_size=batch_size,
        max_cache_len=max_cache_len,
        windows=windows,
        layer_types=layer_types,
        device=device,
        kinds=kinds,
    )


def static_cache_bytes(model: Any, *, batch_size: int, max_cache_len: int) -> int:
    """Bytes the K/V rings of a ``CaptureSafeCache`` of this size will hold, from the
    config alone, before anything is allocated.

    Per attention layer that keeps its own keys/values: ``batch x kv_heads x slots x
    (head_dim + value_head_dim) x element size``, slots ``min(window, max_cache_len)`` on
    sliding layers and ``max_cache_len`` on the others, plus ``batch x slots x
    index_head_dim x element size`` where the layer keeps sparse-attention indexer keys;
    KV-sharing consumers and
    recurrent layers (``linear_attention``, ``mamba``, ``conv``: fixed-size states) add
    nothing here. Python integers throughout: a hostile length cannot wrap.
    """
    config = getattr(model, "config", model)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_layers = _positive_int(getattr(text, "num_hidden_layers", None)) or 0
    if n_layers > _MAX_LAYERS:
        from .errors import CacheDoesNotFitError

        raise CacheDoesNotFitError(
            f"num_hidden_layers={n_layers} is past {_MAX_LAYERS}: not a model this cache can hold"
        )
    heads = _positive_int(getattr(text, "num_attention_heads", None)) or 0
    kv_heads = _positive_int(getattr(text, "num_key_value_heads", None)) or heads
    head_dim = _positive_int(getattr(text, "head_dim", None))
    if head_dim is None and heads:
        head_dim = (_positive_int(getattr(text, "hidden_size", None)) or 0) // heads
    value_dim = _positive_int(getattr(text, "v_head_dim", None)) or head_dim or 0
    element = 4
    params = getattr(model, "parameters", None)
    if callable(params):
        first = next(iter(params()), None)
        if first is not None:
            element = int(first.element_size())
    window = _positive_int(getattr(text, "sliding_window", None))
    total = 0
    layer_types = _layer_types_of(text, n_layers)
    consumers = _config_kv_consumers(text, n_layers)
    indexers = indexer_layers(text, layer_types)
    index_dim = _positive_int(getattr(text, "index_head_dim", None)) or 0
    for layer_type, shared, indexed in zip(layer_types, consumers, indexers, strict=True):
        if shared or "attention" not in layer_type or layer_type.startswith("linear"):
            continue
        slots = (
            min(window, max_cache_len) if ("sliding" in layer_type and window) else max_cache_len
        )
        total += batch_size * kv_heads * slots * ((head_dim or 0) + value_dim) * element
        if indexed:  # the sparse-attention indexer's keys: one head at the ring's slots
            total += batch_size * slots * index_dim * element
    return total


def indexer_layers(config: Any, layer_types: list[str]) -> list[bool]:
    """Which layers keep sparse-attention indexer keys, from the config alone: those whose
    ``indexer_types`` entry is ``full`` (``shared`` ones reuse another layer's selection),
    or every ``indexed_attention`` layer when the config names no indexer types; none
    without a positive whole ``index_head_dim`` (a config is a stranger's file)."""
    kinds = getattr(config, "indexer_types", None)
    if not _positive_int(getattr(config, "index_head_dim", None)):
        return [False] * len(layer_types)
    if isinstance(kinds, (list, tuple)) and len(kinds) >= len(layer_types):
        return [k == "full" for k in kinds[: len(layer_types)]]
    return [t == "indexed_attention" for t in layer_types]


def _element_size(model: Any) -> int:
    params = getattr(model, "parameters", None)
    if callable(params):
        first = next(iter(params()), None)
        if first is not None:
            return int(first.element_size())
    return 4


def check_cache_fits(
    model: Any, *, batch_size: int, max_cache_len: int, device: torch.device | str
) -> int:
    """The static cache's bytes (:func:`static_cache_bytes`); raises
    :class:`~pypto_capture.errors.CacheDoesNotFitError` when they exceed the device's free
    memory (:func:`~pypto_capture.device.free_bytes`). An unknown free figure passes."""
    from .device import free_bytes
    from .errors import CacheDoesNotFitError

    need = static_cache_bytes(model, batch_size=batch_size, max_cache_len=max_cache_len)
    # Beside the rings, what the cache keeps per slot whatever the layers' windows: the
    # valid-slot flags (one byte per row and slot), a decode mask in the model's dtype and
    # the slots' positions (int64). An all-sliding model's rings are its window, but these
    # are max_cache_len long (a 1e10 request tried to allocate 10 GB of flags).
    need += int(batch_size) * int(max_cache_len) * (1 + _element_size(model)) + 8 * int(
        max_cache_len
    )
    free = free_bytes(device)
    if free is not None and need > free:
        raise CacheDoesNotFitError(
            f"a static cache of max_cache_len={max_cache_len} at batch {batch_size} needs "
            f"{need / 2**30:.2f} GiB (keys, values and per-slot masks); {torch.device(device)} has "
            f"{free / 2**30:.2f} GiB free: lower max_cache_len"
        )
    return need


#: more layers than any published model has by far; bounds the per-layer lists built here
_MAX_LAYERS = 1 << 16


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
