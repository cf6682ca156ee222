"""Capture mitigations for transformers models, each undoable.

What breaks capture in a decoder forward, and what we do about it:

1. Attention implementation. The default "sdpa" dispatches, on an Ascend NPU, to a
   fused kernel that runs on a side stream, which stream capture rejects
   (ACL 107025 STREAM_UNJOINED). We require "eager" (``attn="require"``) or switch to it
   (``attn="switch"``, the default, logged), and say so.
2. Mask creation. transformers builds masks with host-side checks (e.g. "is this mask
   all ones, so can SDPA skip it?"), a host sync under capture. 5.24 removed the old
   ``_prepare_4d_causal_attention_mask_for_sdpa`` that earlier scripts patched; masks come
   from ``transformers.masking_utils`` (``create_causal_mask`` & co), imported by name
   into each modeling module. We replace those names *in the modeling modules the model
   uses* with a wrapper that returns a prebuilt additive mask: the capture-safe cache's
   device-computed decode mask, or one you register with ``handle.use_mask``; any other
   call goes to the original. (A 4D mask passed by the caller is returned as is by the
   mask API anyway.) Where the old ``modeling_attn_mask_utils`` helpers still exist
   (transformers < 5.24), they are wrapped the same way.
3. Rotary embeddings. cos/sin are computed from positions on every forward; we
   precompute the tables for *every* rotary module (not just the first) and replace
   each module's forward by a gather, so the captured step holds no trig setup.

``apply_capture_mitigations`` returns a ``MitigationHandle``; ``handle.undo()`` restores
every patched attribute, leaving the model exactly as before.

``needs_capture_mitigations(backend, device_type)`` is the one rule for when a capture
needs them (an NPU graph: ``npugraph``, or ``fused`` on an NPU, which torchair captures);
the decode runner and pypto-bench's prefill graph arm both ask it. A prefill (or any
forward with fixed inputs) has no capture-safe cache to build its masks:
``handle.recording_masks()`` around one eager forward records the masks the model built
and the patched functions return them, prebuilt, during capture.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import torch

from . import _hf
from .backends import auto_backend_name
from .errors import CaptureUnsafeConfigError

log = logging.getLogger(__name__)

__all__ = [
    "MASK_FUNCTIONS",
    "MitigationHandle",
    "apply_capture_mitigations",
    "needs_capture_mitigations",
]

# name -> layer type whose decode mask it stands for
MASK_FUNCTIONS: dict[str, str] = {
    "create_causal_mask": "full_attention",
    "create_sliding_window_causal_mask": "sliding_attention",
    "create_chunked_causal_mask": "chunked_attention",
    "_prepare_4d_causal_attention_mask_for_sdpa": "full_attention",
    "_prepare_4d_causal_attention_mask": "full_attention",
}


@dataclass
class MitigationHandle:
    """What was changed, and how to change it back (``undo()``, or use as a context manager)."""

    applied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    #: layer type -> the additive 4D mask the patched mask functions return (None: the
    #: model's own answer was "no mask needed", returned as such).
    prebuilt_masks: dict[str, torch.Tensor | None] = field(default_factory=dict)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _recording: dict[str, list[Any]] | None = field(default=None, repr=False)
    active: bool = True

    @contextlib.contextmanager
    def recording_masks(self) -> Iterator[None]:
        """Record the masks the model builds in the block; register them as prebuilt.

        Run one eager forward with the inputs the capture will use inside it: each patched
        mask function calls the original and keeps its answer, and afterwards returns
        that answer without building anything (no host checks under capture). A layer
        type whose mask came out different twice in the block (two shapes of input) is
        left to the original function and listed in ``skipped``.
        """
        self._recording = {}
        try:
            yield
        finally:
            recorded, self._recording = self._recording, None
            for kind, masks in sorted(recorded.items()):
                if len(masks) == 1:
                    self.prebuilt_masks[kind] = masks[0]
                    self.applied.append(f"prebuilt-mask:{kind}")
                else:
                    self.skipped.append(
                        f"prebuilt-mask:{kind} ({len(masks)} different masks in one forward)"
                    )

    def use_mask(self, mask: torch.Tensor | dict[str, torch.Tensor]) -> None:
        """Register the prebuilt additive 4D mask(s) the patched mask functions return."""
        if isinstance(mask, dict):
            self.prebuilt_masks.update(mask)
        else:
            self.prebuilt_masks["full_attention"] = mask

    def undo(self) -> None:
        """Restore everything, in reverse order; calling it twice is harmless."""
        while self._undo:
            self._undo.pop()()
        self.prebuilt_masks.clear()
        self.active = False

    def __enter__(self) -> MitigationHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def _setattr_undoable(handle: MitigationHandle, obj: Any, name: str, value: Any) -> None:
    had = name in vars(obj) if hasattr(obj, "__dict__") else False
    old = vars(obj).get(name) if had else None
    setattr(obj, name, value)

    def restore() -> None:
        if had:
            setattr(obj, name, old)
        else:
            try:
                delattr(obj, name)
            except AttributeError:
                pass

    handle._undo.append(restore)


def _is_capture_safe_cache(obj: Any) -> TypeGuard[Any]:
    return obj is not None and hasattr(obj, "decode_masks") and hasattr(obj, "write_pos")


def _same_mask(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    return False


def _mask_wrapper(
    original: Callable[..., Any], kind: str, handle: MitigationHandle
) -> Callable[..., Any]:
    def patched(*args: Any, **kwargs: Any) -> Any:
        if handle._recording is not None:
            out = original(*args, **kwargs)
            seen = handle._recording.setdefault(kind, [])
            if not any(_same_mask(out, old) for old in seen):
                seen.append(out)
            return out
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        embeds = kwargs.get("inputs_embeds", kwargs.get("input_embeds"))
        if embeds is None and len(args) > 1 and isinstance(args[1], torch.Tensor):
            embeds = args[1]
        if _is_capture_safe_cache(cache) and embeds is not None and embeds.shape[1] == 1:
            masks = cache.decode_masks(embeds.dtype)
            if kind in masks:
                return masks[kind]
        if kind in handle.prebuilt_masks:
            return handle.prebuilt_masks[kind]
        return original(*args, **kwargs)

    patched.__wrapped__ = original  # type: ignore[attr-defined]
    patched._pypto_capture_patched = True  # type: ignore[attr-defined]
    patched.__name__ = getattr(original, "__name__", "mask")
    return patched


def _modeling_modules(model: torch.nn.Module) -> list[Any]:
    names = {type(m).__module__ for m in model.modules()}
    names.add("transformers.modeling_attn_mask_utils")
    return [sys.modules[n] for n in sorted(names) if n in sys.modules]


def _patch_masks(model: torch.nn.Module, handle: MitigationHandle) -> None:
    for mod in _modeling_modules(model):
        for name, kind in MASK_FUNCTIONS.items():
            fn = getattr(mod, name, None)
            if fn is None or not callable(fn) or getattr(fn, "_pypto_capture_patched", False):
                continue
            _setattr_undoable(handle, mod, name, _mask_wrapper(fn, kind, handle))
            handle.applied.append(f"mask:{mod.__name__}.{name}")


def _is_rotary(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("RotaryEmbedding") and any(
        "inv_freq" in n for n, _ in module.named_buffers(recurse=False)
    )


def _rotary_layer_types(module: torch.nn.Module, config: Any) -> list[str | None]:
    try:
        params = inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        return [None]
    if "layer_type" not in params:
        return [None]
    types_ = getattr(module, "layer_types", None) or getattr(config, "layer_types", None) or []
    return sorted(set(types_)) or [None]


def _rope_is_dynamic(module: torch.nn.Module) -> bool:
    kinds = getattr(module, "rope_type", None)
    values = kinds.values() if isinstance(kinds, dict) else [kinds]
    return any(isinstance(v, str) and "dynamic" in v for v in values)


def _patch_rotary(
    model: torch.nn.Module,
    handle: MitigationHandle,
    max_positions: int,
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    config = _hf.text_config(model)
    for name, module in model.named_modules():
        if not _is_rotary(module):
            continue
        if _rope_is_dynamic(module):
            handle.skipped.append(
                f"rotary:{name} (dynamic RoPE rescales with length; tables would be wrong)"
            )
            continue
        original = module.forward
        tables: dict[str | None, tuple[torch.Tensor, torch.Tensor]] = {}
        x = torch.zeros(1, 1, 1, device=device, dtype=dtype)
        positions = torch.arange(max_positions, device=device).unsqueeze(0)
        with torch.no_grad():
            for lt in _rotary_layer_types(module, config):
                cos, sin = original(x, positions) if lt is None else original(x, positions, lt)
                tables[lt] = (cos[0].contiguous(), sin[0].contiguous())

        def lookup(
            x: torch.Tensor,
            position_ids: torch.Tensor,
            *args: Any,
            _tables=tables,
            _orig=original,
            **kw: Any,
        ):
            lt = args[0] if args else kw.get("layer_type")
            pair = _tables.get(lt)
            if pair is None or x.dtype != pair[0].dtype:
                return _orig(x, position_ids, *args, **kw)
            cos, sin = pair
            return cos[position_ids], sin[position_ids]

        _setattr_undoable(handle, module, "forward", lookup)
        handle.applied.append(
            f"rotary:{name or type(module).__name__} ({len(tables)} table(s) x {max_positions})"
        )


def needs_capture_mitigations(backend: str, device_type: str) -> bool:
    """Whether a capture by ``backend`` on a ``device_type`` device needs the mitigations.

    NPU graphs do (``npugraph``, ``auto`` on an NPU, and ``fused`` there, which torchair
    captures into an NPU graph): SDPA's fused kernel on a side stream and host-side mask
    checks fail capture with ACL 107025 / 107027. Elsewhere the compile backend and CUDA
    graphs capture the model as it is. ``device_type`` is a string (``"npu"``) so the
    answer is available on machines where ``torch.device("npu")`` cannot be built.
    """
    name = auto_backend_name(device_type) if backend == "auto" else backend
    return name == "npugraph" or (name == "fused" and device_type == "npu")


def apply_capture_mitigations(
    model: torch.nn.Module,
    *,
    attn: str = "switch",
    masks: bool = True,
    rotary: bool = True,
    max_positions: int | None = None,
) -> MitigationHandle:
    """Make ``model``'s decode forward capture-safe; ``handle.undo()`` reverts all of it.

    ``attn``: "switch" (set attn_implementation="eager", logged), "require" (raise
    CaptureUnsafeConfigError unless it already is "eager") or "keep" (leave it; fine for
    the compile backend and on CUDA, not for NPU graphs).
    ``max_positions``: rotary table length (default ``config.max_position_embeddings``).
    """
    if attn not in ("switch", "require", "keep"):
        raise ValueError(f"attn must be 'switch', 'require' or 'keep', got {attn!r}")
    handle = MitigationHandle()
    impl = _hf.attn_implementation(model)
    if impl is not None and impl != "eager" and attn != "keep":
        reason = (
            f"attn_implementation={impl!r} is not capture-safe: SDPA's fused NPU kernel runs on a side "
            "stream and capture fails with ACL 107025 (STREAM_UNJOINED); eager attention is required"
        )
        if attn == "require":
            raise CaptureUnsafeConfigError(
                reason + '; load the model with attn_implementation="eager"'
            )
        log.warning("%s: switching this model to eager attention", reason)
        _hf.set_attn_implementation(model, "eager")

        def restore_attn(impl: str = impl) -> None:
            _hf.set_attn_implementation(model, impl)

        handle._undo.append(restore_attn)
        handle.applied.append(f"attn:{impl}->eager")
    try:
        if masks:
            _patch_masks(model, handle)
        if rotary:
            device, dtype = _hf.model_device_dtype(model)
            config = _hf.text_config(model)
            n = int(max_positions or getattr(config, "max_position_embeddings", 0) or 4096)
            _patch_rotary(model, handle, n, device, dtype)
    except Exception:
        handle.undo()
        raise
    log.info("capture mitigations applied: %s", ", ".join(handle.applied) or "none")
    return handle
