"""Find the first part of a decoder that fails to capture.

Stages, smallest first, each captured on its own at decode shape ([B, 1] tokens against
the capture-safe cache): ``embed_norm`` (embedding + final norm), ``attention`` (the
first layer's self-attention), ``layer`` (the whole first layer), ``moe`` (the first MoE
block found in any layer, skipped when the model has none). The first failing stage, with
its explanation, tells you where to look; later stages are still tried so one report shows
everything.

The MoE stage knows MoE's capture causes: a failing block is explained as MoE routing
(sort/count/cumsum in the region, data-dependent expert selection) and is captured again
with :func:`~pypto_capture.apply_exact_moe` installed on that block alone; the stage's
``exact_moe`` entry says whether that fixes it (the block is restored afterwards).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from . import _hf
from .backends import GraphBackend, capture_and_replay, make_backend
from .errors import CaptureFailedError, UnsupportedModelError
from .explain import CaptureExplanation, explain_capture_error

log = logging.getLogger(__name__)

__all__ = ["STAGES", "BisectResult", "bisect_capture"]

STAGES = ("embed_norm", "attention", "layer", "moe")


@dataclass
class BisectResult:
    failed_stage: str | None
    stages: list[dict[str, Any]] = field(default_factory=list)
    explanation: CaptureExplanation | None = None
    backend: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "failed_stage": self.failed_stage,
            "backend": self.backend,
            "explanation": self.explanation.to_dict() if self.explanation else None,
            "stages": [
                {**s, "explanation": s["explanation"].to_dict() if s.get("explanation") else None}
                for s in self.stages
            ],
        }


def _kwarg_for_cache(module: torch.nn.Module) -> str:
    params = _hf._params_of(type(module).forward)
    return "cache" if "cache" in params else "past_key_values"


def _find_moe(layer: torch.nn.Module) -> torch.nn.Module | None:
    for _, mod in layer.named_modules():
        if hasattr(mod, "experts") and (hasattr(mod, "gate") or hasattr(mod, "router")):
            return mod
    return None


def _first_moe(layers: Any, start: int) -> torch.nn.Module | None:
    """The first MoE block at or after ``start`` (MiniMax M3, DeepSeek-style models put
    dense layers first)."""
    for i in range(start, len(layers)):
        moe = _find_moe(layers[i])
        if moe is not None:
            return moe
    return None


def _rotary(decoder: torch.nn.Module, h: torch.Tensor, pos: torch.Tensor, layer_type: str) -> Any:
    rot = getattr(decoder, "rotary_emb", None)
    if rot is None:
        return None
    params = _hf._params_of(type(rot).forward)
    return rot(h, pos, layer_type) if "layer_type" in params else rot(h, pos)


def bisect_capture(
    model: torch.nn.Module,
    *,
    backend: str | GraphBackend = "auto",
    device: torch.device | str | None = None,
    batch_size: int = 1,
    max_cache_len: int = 16,
    layer_index: int = 0,
    warmup: int = 1,
) -> BisectResult:
    """Capture each stage of ``model``'s decode path alone; name the first that fails."""
    from .decode import DecodeStepRunner  # local: pulls transformers-facing code

    runner = DecodeStepRunner(
        model, batch_size=batch_size, max_cache_len=max_cache_len, backend="eager", device=device
    )
    be = backend if isinstance(backend, GraphBackend) else make_backend(backend, runner.device)
    decoder = _hf.decoder_of(model)
    # A transformers model: get_input_embeddings is not on nn.Module's type.
    embed = cast(Any, model).get_input_embeddings()
    norm = getattr(decoder, "norm", None)
    layers = getattr(decoder, "layers", None)
    if embed is None or norm is None or layers is None or len(layers) <= layer_index:
        raise UnsupportedModelError(
            f"{type(model).__name__} has no embed_tokens/norm/layers structure bisect_capture can split"
        )
    with torch.no_grad():
        runner.prefill(torch.zeros(batch_size, 2, dtype=torch.long, device=runner.device))
    cache = runner.cache
    tok = runner.tok
    layer = layers[layer_index]
    layer_type = cache.layer_types[layer_index]
    with torch.no_grad():
        h = embed(tok).detach().clone()
        pos = cache.decode_position_ids()
        pe = _rotary(decoder, h, pos, layer_type)
        mask = cache.decode_masks(h.dtype)[layer_type]
    attn = getattr(layer, "self_attn", None)
    moe = _first_moe(layers, layer_index)

    def embed_norm() -> torch.Tensor:
        return norm(embed(tok))

    def attention() -> Any:
        assert attn is not None  # the plan lists this stage only when the layer has one
        out = attn(
            hidden_states=h,
            attention_mask=mask,
            position_embeddings=pe,
            **{_kwarg_for_cache(attn): cache},
        )
        return out[0] if isinstance(out, tuple) else out

    def full_layer() -> Any:
        out = layer(
            h,
            attention_mask=mask,
            position_ids=pos,
            position_embeddings=pe,
            use_cache=True,
            **{_kwarg_for_cache(layer): cache},
        )
        return out[0] if isinstance(out, tuple) else out

    def moe_block() -> Any:
        assert moe is not None  # the plan lists this stage only when the layer has one
        out = moe(h)
        return out[0] if isinstance(out, tuple) else out

    plan = [
        ("embed_norm", embed_norm),
        ("attention", attention if attn is not None else None),
        ("layer", full_layer),
        ("moe", moe_block if moe is not None else None),
    ]
    result = BisectResult(failed_stage=None, backend=be.name)
    for stage, fn in plan:
        if fn is None:
            result.stages.append(
                {
                    "stage": stage,
                    "ok": None,
                    "error": "not present in this model",
                    "explanation": None,
                }
            )
            continue
        context = "moe" if stage == "moe" else None
        error = _try_capture(fn, warmup, be)
        if error is None:
            result.stages.append({"stage": stage, "ok": True, "error": None, "explanation": None})
            continue
        expl = explain_capture_error(error, context=context)
        entry: dict[str, Any] = {
            "stage": stage,
            "ok": False,
            "error": str(error)[:500],
            "explanation": expl,
        }
        if stage == "moe":
            assert moe is not None  # the plan lists this stage only when the layer has one
            entry["exact_moe"] = _retry_with_exact_moe(moe, fn, warmup, be)
        result.stages.append(entry)
        if result.failed_stage is None:
            result.failed_stage, result.explanation = stage, expl
        log.info("bisect: stage %s failed: %s", stage, expl)
    return result


def _try_capture(fn: Any, warmup: int, be: GraphBackend) -> BaseException | None:
    """None when ``fn`` captures and replays; else the underlying error."""
    try:
        with torch.no_grad():
            capture_and_replay(fn, warmup=warmup, replays=1, backend=be)
    except CaptureFailedError as err:
        return err.__cause__ or err
    except Exception as err:  # an eager error in the stage itself is also a failure there
        return err
    return None


def _retry_with_exact_moe(
    moe: torch.nn.Module, fn: Any, warmup: int, be: GraphBackend
) -> dict[str, Any]:
    """Capture the MoE block again with the exact capture-safe experts installed."""
    from .moe_exact import apply_exact_moe

    try:
        handle = apply_exact_moe(moe)
    except Exception as err:  # e.g. already installed: then the failure is elsewhere
        return {"ok": None, "error": f"not retried: {err}"}
    if not handle.applied:
        return {"ok": None, "error": "not retried: the block has no fused experts module"}
    try:
        error = _try_capture(fn, warmup, be)
    finally:
        handle.undo()
    if error is None:
        log.info("bisect: the MoE block captures with apply_exact_moe(model)")
        return {"ok": True, "error": None, "fix": "pypto_capture.apply_exact_moe(model)"}
    return {"ok": False, "error": str(error)[:500]}
