"""Find the first part of a decoder that fails to capture.

Stages, smallest first, each captured on its own at decode shape ([B, 1] tokens against
the capture-safe cache): ``embed_norm`` (embedding + final norm), ``attention`` (the
first attention block at or after ``layer_index``), ``mixer`` (the first recurrent mixer:
Mamba, Gated DeltaNet, short conv, ...; listed only when the model has one), ``layer``
(the whole layer at ``layer_index``), ``moe`` (the first MoE block found in any layer,
skipped when the model has none). The first failing stage, with its explanation, tells
you where to look; later stages are still tried so one report shows everything.

The blocks are found by structure, not by attribute names, because every decoder names
them differently (``norm`` / ``final_layernorm`` / ``norm_f`` / ``embedding_norm``,
``self_attn`` / ``mamba`` / ``linear_attn`` / ``mixer`` / ``conv``):

* the layer list is the longest ``nn.ModuleList`` of composite blocks within two levels
  of the decoder (``layers``, ``h``, ``blocks``, ``decoder.layers``);
* the final norm is the first norm-like child (a ``*Norm`` module) registered after the
  layer list, else the last norm-like child of the decoder;
* a layer's mixers are its children whose forward takes a cache argument (``cache``,
  ``past_key_values``, ``cache_params``), or that are named like attention. Which of them
  attends and which is recurrent comes from the capture-safe cache: a layer that holds a
  recurrent state (``state`` kind) has only recurrent mixers (Kimi's ``self_attn`` is a
  delta-rule mixer there); a ``hybrid`` layer (Falcon-H1: attention and Mamba in parallel)
  has both, told apart by name, class (``*Attention``) or a ``position_embeddings``
  argument.

A recurrent mixer is called as the decode step calls it: one token of hidden states and
the prefilled capture-safe cache (its conv / SSM state copied from the prompt), no mask
(decode hands recurrent layers none), so it runs its one-token state-update path and
updates the state in place, which is what a replay must be able to do.

What cannot be found is said in one line naming what bisect needs ("bisect needs the
decoder's layer list: ..."): raised as :class:`UnsupportedModelError` for the embedding
and the layer list (nothing can be split without them), recorded on the stage otherwise.

The MoE stage knows MoE's capture causes: a failing block is explained as MoE routing
(sort/count/cumsum in the region, data-dependent expert selection) and is captured again
with :func:`~pypto_capture.apply_exact_moe` installed on that block alone; the stage's
``exact_moe`` entry says whether that fixes it (the block is restored afterwards).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from . import _hf
from .backends import GraphBackend, capture_and_replay, make_backend
from .cache import check_cache_fits
from .device import resolve_device
from .errors import CaptureFailedError, UnsupportedModelError
from .explain import CaptureExplanation, explain_capture_error

log = logging.getLogger(__name__)

__all__ = ["MIXER_STAGE", "STAGES", "BisectResult", "bisect_capture"]

#: The stages every bisection lists (``ok: None`` where the model has no such block).
STAGES = ("embed_norm", "attention", "layer", "moe")
#: Listed after ``attention`` only for models with a recurrent mixer.
MIXER_STAGE = "mixer"

# Names of attention children (a child so named is a mixer even if its forward takes no
# cache argument, as before structural discovery).
_ATTENTION_NAMES = ("self_attn", "self_attention", "attention", "attn")
# Forward arguments through which a mixer reads and writes its cache.
_CACHE_PARAMS = ("cache", "past_key_values", "cache_params", "past_key_value", "layer_past")
# Fallback names of the final norm when no norm-like child follows the layer list.
_NORM_NAMES = ("norm", "final_layernorm", "norm_f", "ln_f", "final_norm", "final_layer_norm")


@dataclass
class BisectResult:
    """Per-stage verdicts: ``ok`` True / False / None (not present or not callable), the
    underlying ``error``, its ``explanation``, and the ``module`` / ``class`` captured."""

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


class _CannotCall(Exception):
    """A stage's module wants arguments bisect cannot supply (the message says which)."""


# --- finding the blocks ----------------------------------------------------------------


def _children_text(module: torch.nn.Module, limit: int = 12) -> str:
    kids = [f"{n} ({type(c).__name__})" for n, c in module.named_children()]
    more = f", ... ({len(kids) - limit} more)" if len(kids) > limit else ""
    return ", ".join(kids[:limit]) + more if kids else "none"


def _is_composite(module: torch.nn.Module) -> bool:
    return next(module.children(), None) is not None


def _layer_list(decoder: torch.nn.Module) -> tuple[str, torch.nn.ModuleList] | None:
    """The longest ModuleList of composite blocks within two levels of the decoder.

    Two levels covers ``layers`` / ``h`` / ``blocks`` and ``decoder.layers``; deeper lists
    (an MoE block's experts) live inside a layer and are never the layer list.
    """
    best: tuple[tuple[int, int], str, torch.nn.ModuleList] | None = None
    for path, mod in decoder.named_modules():
        if not path or not isinstance(mod, torch.nn.ModuleList) or len(mod) == 0:
            continue
        depth = path.count(".") + 1
        if depth > 2 or not all(_is_composite(m) for m in mod):
            continue
        key = (len(mod), -depth)
        if best is None or key > best[0]:
            best = (key, path, mod)
    return None if best is None else (best[1], best[2])


def _is_norm(module: torch.nn.Module) -> bool:
    norms: tuple[type, ...] = (torch.nn.LayerNorm,) + (
        (torch.nn.RMSNorm,) if hasattr(torch.nn, "RMSNorm") else ()
    )
    return isinstance(module, norms) or "norm" in type(module).__name__.lower()


def _final_norm(decoder: torch.nn.Module, layers_path: str) -> tuple[str, torch.nn.Module] | None:
    """The module applied after the layers: the first norm-like child registered after
    the layer list (in the list's parent), else a conventionally named one, else the last
    norm-like child of the decoder."""
    parent_path, _, list_name = layers_path.rpartition(".")
    parent = decoder.get_submodule(parent_path) if parent_path else decoder
    after = False
    for name, child in parent.named_children():
        if name == list_name:
            after = True
        elif after and _is_norm(child):
            return (f"{parent_path}.{name}" if parent_path else name), child
    for name in _NORM_NAMES:
        named = getattr(decoder, name, None)
        if isinstance(named, torch.nn.Module):
            return name, named
    norms = [(n, c) for n, c in decoder.named_children() if _is_norm(c)]
    return norms[-1] if norms else None


def _embedding(model: torch.nn.Module, decoder: torch.nn.Module) -> torch.nn.Module | None:
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            emb = get()
        except Exception:
            emb = None
        if isinstance(emb, torch.nn.Module):
            return emb
    for path, mod in decoder.named_modules():
        if path and path.count(".") < 2 and isinstance(mod, torch.nn.Embedding):
            return mod
    return None


def _rotary_module(decoder: torch.nn.Module) -> torch.nn.Module | None:
    rot = getattr(decoder, "rotary_emb", None)
    if isinstance(rot, torch.nn.Module):
        return rot
    for _, child in decoder.named_children():  # LFM2-MoE calls it pos_emb
        if "rotary" in type(child).__name__.lower():
            return child
    return None


def _rotary(
    rot: torch.nn.Module | None, h: torch.Tensor, pos: torch.Tensor, layer_type: str
) -> Any:
    if rot is None:
        return None
    params = _hf._params_of(type(rot).forward)
    return rot(h, pos, layer_type) if "layer_type" in params else rot(h, pos)


def _cache_param(module: torch.nn.Module) -> str | None:
    params = _hf._params_of(type(module).forward)
    return next((p for p in _CACHE_PARAMS if p in params), None)


def _is_attention(name: str, child: torch.nn.Module) -> bool:
    params = _hf._params_of(type(child).forward)
    return (
        name in _ATTENTION_NAMES
        or type(child).__name__.endswith("Attention")
        or "position_embeddings" in params
    )


def _mixers(layer: torch.nn.Module, kind: str | None) -> list[tuple[str, torch.nn.Module, str]]:
    """(name, module, "attention" | "recurrent") for each mixer child of ``layer``."""
    out = []
    for name, child in layer.named_children():
        if _cache_param(child) is None and name not in _ATTENTION_NAMES:
            continue
        if kind == "state":
            role = "recurrent"
        elif kind in ("attention", "indexed", "shared"):
            role = "attention"
        else:  # hybrid, stateless or unknown: by the child's own signs
            role = "attention" if _is_attention(name, child) else "recurrent"
        out.append((name, child, role))
    return out


def _moe_of(layer: torch.nn.Module) -> tuple[str, torch.nn.Module] | None:
    for name, mod in layer.named_modules():
        if hasattr(mod, "experts") and (hasattr(mod, "gate") or hasattr(mod, "router")):
            return name, mod
    return None


def _first_moe(layers: Any, start: int) -> tuple[int, str, torch.nn.Module] | None:
    """The first MoE block at or after ``start`` (MiniMax M3, DeepSeek-style models put
    dense layers first)."""
    for i in range(start, len(layers)):
        found = _moe_of(layers[i])
        if found is not None:
            return i, found[0], found[1]
    return None


@dataclass
class _Blocks:
    decoder: torch.nn.Module
    embed: torch.nn.Module
    layers_path: str
    layers: torch.nn.ModuleList
    norm_path: str | None
    norm: torch.nn.Module | None


def _find_blocks(model: torch.nn.Module, layer_index: int) -> _Blocks:
    decoder = _hf.decoder_of(model)
    dname = type(decoder).__name__
    embed = _embedding(model, decoder)
    if embed is None:
        raise UnsupportedModelError(
            f"bisect needs the decoder's token embedding: {type(model).__name__}."
            f"get_input_embeddings() gives none and no nn.Embedding is under {dname}; "
            f"found children: {_children_text(decoder)}"
        )
    found = _layer_list(decoder)
    if found is None:
        raise UnsupportedModelError(
            f"bisect needs the decoder's layer list: no nn.ModuleList of repeated blocks "
            f"under {dname}; found children: {_children_text(decoder)}"
        )
    layers_path, layers = found
    if len(layers) <= layer_index:
        raise UnsupportedModelError(
            f"bisect needs layer {layer_index}: {dname}.{layers_path} has {len(layers)} layers"
        )
    norm = _final_norm(decoder, layers_path)
    return _Blocks(
        decoder=decoder,
        embed=embed,
        layers_path=layers_path,
        layers=layers,
        norm_path=norm[0] if norm else None,
        norm=norm[1] if norm else None,
    )


# --- calling a block --------------------------------------------------------------------


def _bind(module: torch.nn.Module, offered: dict[str, Any]) -> dict[str, Any]:
    """The part of ``offered`` the module's forward takes (all of it behind ``**kwargs``);
    raises _CannotCall naming the required arguments bisect does not have."""
    try:
        params = list(inspect.signature(type(module).forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return dict(offered)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        kwargs = dict(offered)
    else:
        names = {p.name for p in params}
        kwargs = {k: v for k, v in offered.items() if k in names}
    missing = [
        p.name
        for p in params[1:]  # the first one gets the hidden states
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in kwargs
    ]
    if missing:
        raise _CannotCall(
            f"bisect cannot call {type(module).__name__}.forward: it requires "
            f"{', '.join(missing)}, which a decode-shaped stage does not supply"
        )
    return kwargs


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, tuple) else out


def _stage_call(
    module: torch.nn.Module, h: torch.Tensor, offered: dict[str, Any]
) -> Callable[[], Any]:
    kwargs = _bind(module, offered)

    def call() -> Any:
        return _first(module(h, **kwargs))

    return call


def bisect_capture(
    model: torch.nn.Module,
    *,
    backend: str | GraphBackend = "auto",
    device: torch.device | str | None = None,
    batch_size: int = 1,
    max_cache_len: int = 16,
    layer_index: int = 0,
    warmup: int = 1,
    budget_s: float | None = None,
) -> BisectResult:
    """Capture each stage of ``model``'s decode path alone; name the first that fails.

    ``budget_s``: no stage starts once this many seconds have gone since the bisect began;
    the stages left are listed with ``ok`` None and the reason (a stage that has started
    runs to its end: a compile cannot be interrupted safely in process). What runs after a
    failed arm is then bounded like the arm itself.

    Raises :class:`UnsupportedModelError` ("bisect needs ...") when the model has no
    embedding or no layer list bisect can find, and :class:`CacheDoesNotFitError` when the
    static cache asked for exceeds the device's free memory (before allocating it).
    """
    from .decode import DecodeStepRunner  # local: pulls transformers-facing code

    if budget_s is not None and not (isinstance(budget_s, (int, float)) and budget_s > 0):
        raise ValueError(f"budget_s={budget_s!r}: pass a positive number of seconds or None")
    started = time.monotonic()
    blocks = _find_blocks(model, layer_index)  # before any forward: say what is missing first
    dev = resolve_device(device)
    # a hostile --max-cache-len is refused here, not OOM-killed mid-allocation
    check_cache_fits(model, batch_size=batch_size, max_cache_len=max_cache_len, device=dev)
    runner = DecodeStepRunner(
        model, batch_size=batch_size, max_cache_len=max_cache_len, backend="eager", device=dev
    )
    be = backend if isinstance(backend, GraphBackend) else make_backend(backend, runner.device)
    with torch.no_grad():
        runner.prefill(torch.zeros(batch_size, 2, dtype=torch.long, device=runner.device))
    cache = runner.cache
    tok = runner.tok
    layers, embed, norm = blocks.layers, blocks.embed, blocks.norm
    kinds: list[str | None] = list(getattr(cache, "kinds", None) or [None] * len(layers))
    rot = _rotary_module(blocks.decoder)
    with torch.no_grad():
        h = embed(tok).detach().clone()
        pos = cache.decode_position_ids()
        masks = cache.decode_masks(h.dtype)

    def inputs(i: int) -> dict[str, Any]:
        """What layer ``i``'s blocks get in a decode step: its layer type's mask, rotary."""
        layer_type = cache.layer_types[i]
        with torch.no_grad():
            pe = _rotary(rot, h, pos, layer_type)
        return {"attention_mask": masks.get(layer_type), "position_embeddings": pe}

    def path(i: int, name: str = "") -> str:
        return f"{blocks.layers_path}.{i}" + (f".{name}" if name else "")

    # The first attention block and the first recurrent mixer at or after layer_index.
    attn: tuple[int, str, torch.nn.Module] | None = None
    mixer: tuple[int, str, torch.nn.Module] | None = None
    for i in range(layer_index, len(layers)):
        for name, child, role in _mixers(layers[i], kinds[i] if i < len(kinds) else None):
            if role == "attention" and attn is None:
                attn = (i, name, child)
            elif role == "recurrent" and mixer is None:
                mixer = (i, name, child)
    recurrent_layers = [
        i for i in range(layer_index, len(kinds)) if kinds[i] in ("state", "hybrid")
    ]
    moe_found = _first_moe(layers, layer_index)
    moe = moe_found[2] if moe_found is not None else None
    layer = layers[layer_index]

    plan: list[tuple[str, dict[str, Any], Callable[[], Callable[[], Any]] | None, str]] = []

    # embed_norm
    if norm is None:
        plan.append(
            (
                "embed_norm",
                {},
                None,
                f"bisect needs the decoder's final norm: no norm-like child after "
                f"{blocks.layers_path} under {type(blocks.decoder).__name__}; found "
                f"children: {_children_text(blocks.decoder)}",
            )
        )
    else:
        final_norm = norm

        def embed_norm() -> Callable[[], Any]:
            return lambda: final_norm(embed(tok))

        plan.append(
            (
                "embed_norm",
                {"module": blocks.norm_path, "class": type(norm).__name__},
                embed_norm,
                "",
            )
        )

    # attention
    if attn is None:
        plan.append(("attention", {}, None, "not present in this model"))
    else:
        ai, aname, amod = attn

        def attention() -> Callable[[], Any]:
            kw = _cache_param(amod) or _hf.cache_kwarg(model)
            return _stage_call(amod, h, {**inputs(ai), kw: cache})

        plan.append(
            ("attention", {"module": path(ai, aname), "class": type(amod).__name__}, attention, "")
        )

    # mixer (recurrent models only)
    if mixer is not None:
        mi, mname, mmod = mixer

        def recurrent() -> Callable[[], Any]:
            kw = _cache_param(mmod) or _hf.cache_kwarg(model)
            return _stage_call(mmod, h, {kw: cache, "attention_mask": None})

        plan.append(
            (MIXER_STAGE, {"module": path(mi, mname), "class": type(mmod).__name__}, recurrent, "")
        )
    elif recurrent_layers:
        first = layers[recurrent_layers[0]]
        plan.append(
            (
                MIXER_STAGE,
                {},
                None,
                f"bisect needs the layer's recurrent mixer: no child of {type(first).__name__} "
                f"({path(recurrent_layers[0])}) takes a cache argument "
                f"({', '.join(_CACHE_PARAMS[:3])}); found children: {_children_text(first)}",
            )
        )

    # layer
    def full_layer() -> Callable[[], Any]:
        kw = _cache_param(layer) or _hf.cache_kwarg(model)
        offered = {**inputs(layer_index), "position_ids": pos, "use_cache": True, kw: cache}
        return _stage_call(layer, h, offered)

    plan.append(
        ("layer", {"module": path(layer_index), "class": type(layer).__name__}, full_layer, "")
    )

    # moe
    if moe_found is None:
        plan.append(("moe", {}, None, "not present in this model"))
    else:
        oi, oname, moe_block = moe_found

        def moe_stage() -> Callable[[], Any]:
            return lambda: _first(moe_block(h))

        info = {"module": path(oi, oname), "class": type(moe_block).__name__}
        plan.append(("moe", info, moe_stage, ""))

    result = BisectResult(failed_stage=None, backend=be.name)
    for stage, info, build, why in plan:
        base = {"stage": stage, "module": None, "class": None, **info}
        fn: Callable[[], Any] | None = None
        spent = time.monotonic() - started
        if build is not None and budget_s is not None and spent >= budget_s:
            why = f"not run: the bisect's {budget_s:g} s budget was spent ({spent:.0f} s)"
            build = None
        if build is not None:
            try:
                fn = build()
            except _CannotCall as err:
                why = str(err)
        if fn is None:
            result.stages.append({**base, "ok": None, "error": why, "explanation": None})
            continue
        error = _try_capture(fn, warmup, be)
        if error is None:
            result.stages.append({**base, "ok": True, "error": None, "explanation": None})
            continue
        expl = explain_capture_error(error, context="moe" if stage == "moe" else None)
        entry: dict[str, Any] = {
            **base,
            "ok": False,
            "error": _error_line(error, expl),
            "explanation": expl,
        }
        if stage == "moe":
            assert moe is not None  # the plan builds this stage only when there is one
            entry["exact_moe"] = _retry_with_exact_moe(moe, fn, warmup, be)
        result.stages.append(entry)
        if result.failed_stage is None:
            result.failed_stage, result.explanation = stage, expl
        log.info("bisect: stage %s failed: %s", stage, expl)
    return result


def _error_line(error: BaseException, expl: CaptureExplanation) -> str:
    """The underlying error first (``KeyError: 'full_attention'``), then the raw text."""
    raw = " ".join(f"{type(error).__name__}: {error}".split())
    head = expl.underlying
    line = raw if not head or raw.startswith(head) else f"{head} | {raw}"
    return line[:500]


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
