"""Strict loading of the published Kimi-Linear checkpoints into the native module layout.

transformers 5.24 already loads the published weight names into its native
``KimiLinearForCausalLM`` (``conversion_mapping.py``, entry ``kimi_linear``): that is the
mapping used here, nothing more. Why not its loader: it fills a weight the checkpoint
lacks with random values and only logs it, keeps the last of two tensors that land on
the same parameter, and loads NaNs as they are. This loader reads the same names
strictly, version-independently:

* renames: KDA ``self_attn.{f_a_proj,f_b_proj}.weight`` / ``self_attn.{dt_bias,A_log}``
  -> ``self_attn.forget_gate.*``; MoE ``block_sparse_moe.{gate,shared_experts}.*`` ->
  ``mlp.*`` (the dense first layer is ``mlp.*`` in the checkpoint already);
* merges: KDA ``self_attn.{q,k,v}_conv1d.weight`` -> ``self_attn.conv1d.weight``
  (concatenated in that order); per-expert ``w1`` / ``w3`` (gate / up) ->
  ``mlp.experts.gate_up_proj[e]`` and ``w2`` -> ``mlp.experts.down_proj[e]``;
* every other name (embeddings, norms, KDA projections, the MLA projections, ``lm_head``)
  is the native name; a native-named tensor is accepted too, but never beside its
  published spelling;
* strict: every checkpoint tensor is used exactly once. A tensor stored twice (in two
  shards, or under two names that land on one parameter), a missing, unexpected or
  wrongly shaped weight, or a weight holding NaN / inf is one ``KimiWeightsError`` line
  naming it and the fix. The folder is read through the project's one strict checkpoint
  reader (:func:`iter_checkpoint`), which also refuses a block scale beside a weight that
  is not FP8 (this release has none), an FP8 weight without one, and a shard outside the
  folder or behind a link no pypto-patch overlay records. The model is built on the meta device and the tensors are
  assigned, so nothing is allocated twice.

dtypes follow native transformers: the requested dtype, except the parameters the native
class keeps in float32 (``_keep_in_fp32_modules_strict``: the router ``gate.weight``, its
``e_score_correction_bias`` and the KDA ``dt_bias``) when loading in bfloat16 / float16.
Nothing here writes to the folder.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pypto_capture.weights import read_folder
from pypto_patch import PatchError, overlay_links

from .errors import KimiWeightsError

log = logging.getLogger(__name__)

__all__ = ["LoadReport", "iter_checkpoint", "load_checkpoint", "target_of"]

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_REDOWNLOAD = "re-download the model"


# --- reading the folder -------------------------------------------------------------------


def iter_checkpoint(folder: Path) -> Iterator[tuple[str, str, torch.Tensor]]:
    """(shard file name, tensor name, tensor) for every tensor of the folder, lazily. Read by the
    shared strict reader (``pypto_capture.weights.read_folder``, following only the links
    a pypto-patch overlay records); its refusals are ``KimiWeightsError`` lines.
    """
    found = read_folder(folder, links=overlay_links, error=KimiWeightsError, also=(PatchError,))
    for entry, tensor in found:
        yield entry.shard, entry.name, tensor


# --- name mapping -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    """Where one checkpoint tensor goes: ``copy`` to ``key``; ``conv`` as part ``part``
    (0 q, 1 k, 2 v) of ``key``; ``expert`` ``index``'s ``part`` ("gate", "up", "down")."""

    key: str
    kind: str = "copy"
    part: str = ""
    index: int = 0


_CONV = re.compile(r"^(.*\.self_attn)\.([qkv])_conv1d\.weight$")
_FORGET = re.compile(r"^(.*\.self_attn)\.(f_a_proj\.weight|f_b_proj\.weight|dt_bias|A_log)$")
_EXPERT = re.compile(r"^(.*)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$")
_W_PART = {"w1": "gate", "w3": "up", "w2": "down"}
_CONV_PARTS = ("q", "k", "v")


def target_of(name: str) -> _Target:
    """The native parameter a published checkpoint tensor becomes (see the module
    docstring); names already native map to themselves."""
    m = _CONV.match(name)
    if m:
        return _Target(f"{m.group(1)}.conv1d.weight", "conv", m.group(2))
    m = _FORGET.match(name)
    if m:
        return _Target(f"{m.group(1)}.forget_gate.{m.group(2)}")
    m = _EXPERT.match(name)
    if m:
        prefix, index, w = m.group(1), int(m.group(2)), m.group(3)
        part = _W_PART[w]
        key = f"{prefix}.mlp.experts.{'down_proj' if part == 'down' else 'gate_up_proj'}"
        return _Target(key, "expert", part, index)
    if ".block_sparse_moe." in name:
        return _Target(name.replace(".block_sparse_moe.", ".mlp.", 1))
    return _Target(name)


# --- assembling ---------------------------------------------------------------------------


@dataclass
class LoadReport:
    """What a load read and converted (for the log line and for tests)."""

    tensors: int = 0  #: checkpoint tensors read, each used exactly once
    shards: int = 0
    renamed: int = 0  #: published names that differ from the native one
    merged: dict[str, int] = field(default_factory=dict)  #: native key kind -> merges


def _layer_of(name: str) -> int | None:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def _where(keys: list[str]) -> str:
    layers = sorted({n for k in keys if (n := _layer_of(k)) is not None})
    more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
    if not layers:
        return f"{keys[0]}{more}"
    shown = ", ".join(str(i) for i in layers[:6]) + (", ..." if len(layers) > 6 else "")
    return f"layer{'s' if len(layers) > 1 else ''} {shown} ({keys[0]}{more})"


def _merge(key: str, parts: list[torch.Tensor], *, stack: bool = False) -> torch.Tensor:
    """Concatenate (or stack) the parts of ``key``; parts that do not fit are one line."""
    try:
        return torch.stack(parts) if stack else torch.cat(parts)
    except RuntimeError as err:
        raise KimiWeightsError(
            f"the checkpoint's parts of {key} do not fit together "
            f"({' '.join(str(err).split())[:160]}): the folder mixes two checkpoints; "
            f"{_REDOWNLOAD}"
        ) from err


def load_checkpoint(
    folder: Path,
    expected: dict[str, torch.Size],
    *,
    num_experts: int,
    dtype: torch.dtype,
    keep_fp32: Callable[[str], bool] = lambda key: False,
) -> tuple[dict[str, torch.Tensor], LoadReport]:
    """The folder's tensors under the native model's state-dict names.

    ``expected``: the model's state-dict keys and shapes (from the meta model);
    ``keep_fp32(key)``: whether that parameter stays float32 (see the module docstring).
    Raises ``KimiWeightsError`` (one line) on anything that does not fit.
    """
    report = LoadReport()
    sources: dict[tuple[str, str, int], str] = {}  # (key, part, index) -> checkpoint name
    singles: dict[str, torch.Tensor] = {}
    convs: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    experts: dict[str, dict[str, dict[int, torch.Tensor]]] = defaultdict(lambda: defaultdict(dict))
    shards: set[str] = set()
    for shard, name, tensor in iter_checkpoint(folder):
        shards.add(shard)
        target = target_of(name)
        slot = (target.key, target.part, target.index)
        if slot in sources:
            raise KimiWeightsError(
                f"weights {sources[slot]} and {name} both load into {target.key}"
                f"{f' (expert {target.index})' if target.kind == 'expert' else ''}: the folder "
                f"mixes two checkpoint formats; {_REDOWNLOAD}"
            )
        sources[slot] = name
        report.tensors += 1
        report.renamed += target.key != name
        if target.kind == "copy":
            singles[target.key] = tensor
        elif target.kind == "conv":
            convs[target.key][target.part] = tensor
        else:
            experts[target.key][target.part][target.index] = tensor
    report.shards = len(shards)

    state: dict[str, torch.Tensor] = dict(singles)
    missing_parts: list[str] = []
    unexpected: list[str] = []
    for key, parts in convs.items():
        lacking = [p for p in _CONV_PARTS if p not in parts]
        if lacking:
            missing_parts.append(f"{key.replace('.conv1d.weight', '')}.{lacking[0]}_conv1d.weight")
            continue
        state[key] = _merge(key, [parts[p] for p in _CONV_PARTS])
        report.merged["conv1d"] = report.merged.get("conv1d", 0) + 1
    for key, by_part in experts.items():
        names = ("down",) if key.endswith("down_proj") else ("gate", "up")
        prefix = key.rsplit(".mlp.experts.", 1)[0] + ".block_sparse_moe.experts"
        complete = True
        for part in names:
            have = by_part.get(part, {})
            w = {"gate": "w1", "up": "w3", "down": "w2"}[part]
            absent = [e for e in range(num_experts) if e not in have]
            if absent:
                complete = False
                missing_parts.append(f"{prefix}.{absent[0]}.{w}.weight")
            extra = sorted(e for e in have if e >= num_experts)
            if extra:
                unexpected.append(f"{prefix}.{extra[0]}.{w}.weight")
        if not complete or unexpected:
            continue
        if key.endswith("down_proj"):
            downs = by_part["down"]
            state[key] = _merge(key, [downs[e] for e in range(num_experts)], stack=True)
        else:
            gates, ups = by_part["gate"], by_part["up"]
            pairs = [_merge(key, [gates[e], ups[e]]) for e in range(num_experts)]
            state[key] = _merge(key, pairs, stack=True)
        report.merged["experts"] = report.merged.get("experts", 0) + 1
    if missing_parts:
        raise KimiWeightsError(
            f"the checkpoint lacks weights for {_where(missing_parts)}: the download is "
            f"incomplete or config.json does not match the weights; {_REDOWNLOAD}"
        )
    unexpected += sorted(sources.get((k, "", 0), k) for k in state if k not in expected)
    if unexpected:
        raise KimiWeightsError(
            f"the checkpoint has weights config.json does not describe, for "
            f"{_where(sorted(unexpected))}: the folder mixes two checkpoints; {_REDOWNLOAD}"
        )
    missing = sorted(k for k in expected if k not in state)
    if missing:
        raise KimiWeightsError(
            f"the checkpoint lacks weights for {_where(missing)}: the download is incomplete "
            f"or config.json does not match the weights; {_REDOWNLOAD}"
        )
    for key, shape in expected.items():
        if tuple(state[key].shape) != tuple(shape):
            raise KimiWeightsError(
                f"weight {sources.get((key, '', 0), key)} is {list(state[key].shape)} in the checkpoint but config.json "
                f"makes it {list(shape)}: the folder mixes two checkpoints; {_REDOWNLOAD}"
            )
    for key, value in state.items():
        if value.is_floating_point():
            wanted = torch.float32 if keep_fp32(key) else dtype
            state[key] = value.to(wanted)
    return state, report
