"""Strict loading of the released MiniMax checkpoints into the native module layout.

Why not transformers' loader: it fills a weight the checkpoint lacks with random values
and only logs it; its FP8 path needs ``accelerate``, derives the block size from the scale
grid (wrong for partial edge blocks: a 200-row matrix has a 2-row grid, i.e. blocks of
100, not 128) and leaves the model flagged as quantized; and its key renames changed
across 5.x. This loader reads the checkpoint's own names, version-independently:

* renames: M2.7 ``block_sparse_moe.*`` -> ``mlp.*``; M3 ``language_model.model.*`` ->
  ``model.*``, ``block_sparse_moe.{gate,experts,shared_experts}`` -> ``mlp.*``,
  ``e_score_correction_bias`` -> ``mlp.gate.e_score_correction_bias``,
  ``self_attn.index_*`` -> ``self_attn.indexer.*``;
* merges: per-expert ``w1``/``w3`` (gate/up) -> ``experts.gate_up_proj[e]`` and ``w2`` ->
  ``experts.down_proj[e]``; dense and shared ``gate_proj``+``up_proj`` -> ``gate_up_proj``;
* FP8 e4m3 weights with a ``weight_scale_inv`` per block (128x128 in the release) are
  dequantised to the requested dtype: value = fp8 x scale of its block, edge blocks
  partial; a scale grid that does not fit the weight is an error, not a guess;
* read through the project's one strict checkpoint reader (:func:`iter_checkpoint`): a
  tensor stored twice, a scale beside a weight that is not FP8 (or an FP8 weight without
  one), a scale stored as integers, NaN / inf in any tensor, a shard outside the folder
  or behind a link no pypto-patch overlay records: one line naming tensor and shard;
* skipped with one log line each: the MTP modules (layers past ``num_hidden_layers``, or
  names with an ``mtp`` part: decoding does not use them) and, for M3, the vision tower
  and projector (text backbone only);
* strict: a missing, unexpected or wrongly shaped weight is one ``MiniMaxWeightsError``
  line naming the layer. The model is built on the meta device and the tensors are
  assigned, so nothing is allocated twice; buffers the modules compute themselves (the
  rotary frequencies) are rebuilt on the real device.

Nothing here writes to the folder.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pypto_capture.weights import read_folder
from pypto_patch import PatchError, overlay_links

from .errors import MiniMaxWeightsError

log = logging.getLogger(__name__)

__all__ = ["LoadReport", "dequantize_fp8_blocks", "iter_checkpoint", "load_checkpoint"]

_SCALE = "weight_scale_inv"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_MTP = re.compile(r"(?:^|\.)mtp(?:[._]|$)")


def dequantize_fp8_blocks(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype: torch.dtype
) -> torch.Tensor:
    """FP8 ``weight`` [R, C] times its per-block ``scale_inv`` [ceil(R/br), ceil(C/bc)].

    Edge blocks may be partial; the grid must be exactly the one ``block`` implies.
    """
    rows, cols = weight.shape
    br, bc = block
    grid = (-(-rows // br), -(-cols // bc))
    if scale_inv.dim() != 2 or tuple(scale_inv.shape) != grid:
        raise ValueError(
            f"scale grid {list(scale_inv.shape)} does not fit a [{rows}, {cols}] weight in "
            f"{br}x{bc} blocks (needs {list(grid)})"
        )
    scale = scale_inv.float().repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
    return (weight.float() * scale).to(dtype)


# --- reading the folder -------------------------------------------------------------------


def iter_checkpoint(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the folder's safetensors shards, lazily. Read by the
    shared strict reader (``pypto_capture.weights.read_folder``, following only the links
    a pypto-patch overlay records); its refusals are ``MiniMaxWeightsError`` lines.
    """
    found = read_folder(folder, links=overlay_links, error=MiniMaxWeightsError, also=(PatchError,))
    for entry, tensor in found:
        yield entry.name, tensor


# --- name mapping -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    """Where one checkpoint tensor goes: ``copy`` to ``key``; ``cat`` as part ``part``
    (0 gate, 1 up) of ``key``; ``expert`` ``index``'s ``part`` ("gate", "up", "down")."""

    key: str
    kind: str = "copy"
    part: Any = None
    index: int = 0


_EXPERT = re.compile(r"^(.*)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$")
_W_PART = {"w1": "gate", "w3": "up", "w2": "down"}


def _map_m27(name: str) -> _Target | None:
    m = _EXPERT.match(name)
    if m:
        prefix, index, w = m.group(1), int(m.group(2)), m.group(3)
        part = _W_PART[w]
        key = f"{prefix}.mlp.experts.{'down_proj' if part == 'down' else 'gate_up_proj'}"
        return _Target(key, "expert", part, index)
    if ".block_sparse_moe." in name:
        return _Target(name.replace(".block_sparse_moe.", ".mlp."))
    return _Target(name)


_M3_RENAMES = (
    (
        re.compile(r"\.block_sparse_moe\.e_score_correction_bias$"),
        ".mlp.gate.e_score_correction_bias",
    ),
    (re.compile(r"\.block_sparse_moe\.(gate|shared_experts)\."), r".mlp.\1."),
    (re.compile(r"\.self_attn\.index_(q_proj|k_proj|q_norm|k_norm)\."), r".self_attn.indexer.\1."),
)
_GATE_UP = re.compile(r"^(.*\.(?:mlp|shared_experts))\.(gate_proj|up_proj)\.weight$")
_VISION = re.compile(r"^(vision_tower|multi_modal_projector|patch_merge_mlp)\.")


def _map_m3(name: str) -> _Target | None:
    if name == "language_model.lm_head.weight":
        return _Target("lm_head.weight")
    if not name.startswith("language_model.model."):
        return None  # decided by the caller (vision part, or unexpected)
    name = "model." + name[len("language_model.model.") :]
    m = _EXPERT.match(name)
    if m:
        prefix, index, w = m.group(1), int(m.group(2)), m.group(3)
        part = _W_PART[w]
        key = f"{prefix}.mlp.experts.{'down_proj' if part == 'down' else 'gate_up_proj'}"
        return _Target(key, "expert", part, index)
    for pattern, repl in _M3_RENAMES:
        name = pattern.sub(repl, name)
    m = _GATE_UP.match(name)
    if m:
        return _Target(
            f"{m.group(1)}.gate_up_proj.weight", "cat", 0 if m.group(2) == "gate_proj" else 1
        )
    return _Target(name)


# --- assembling ---------------------------------------------------------------------------


@dataclass
class LoadReport:
    """What a load read, converted and skipped (for the log line and for tests)."""

    dequantized: int = 0
    mtp_tensors: int = 0
    vision_tensors: int = 0
    block: tuple[int, int] | None = None
    skipped: dict[str, int] = field(default_factory=dict)


def _layer_of(name: str) -> int | None:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def _where(keys: list[str]) -> str:
    layers = sorted({n for k in keys if (n := _layer_of(k)) is not None})
    if not layers:
        return keys[0]
    shown = ", ".join(str(i) for i in layers[:6]) + (", ..." if len(layers) > 6 else "")
    return f"layer{'s' if len(layers) > 1 else ''} {shown} ({keys[0]}{f' and {len(keys) - 1} more' if len(keys) > 1 else ''})"


def load_checkpoint(
    folder: Path,
    family: str,
    expected: dict[str, torch.Size],
    *,
    num_hidden_layers: int,
    num_experts: int,
    dtype: torch.dtype,
    block: tuple[int, int] = (128, 128),
) -> tuple[dict[str, torch.Tensor], LoadReport]:
    """The folder's tensors under the model's state-dict names, in ``dtype``.

    ``expected``: the model's state-dict keys and shapes (from the meta model). Raises
    ``MiniMaxWeightsError`` (one line) on anything that does not fit.
    """
    mapper = _map_m27 if family == "minimax_m27" else _map_m3
    report = LoadReport()
    raw: dict[str, torch.Tensor] = {}
    scales: dict[str, torch.Tensor] = {}
    for name, tensor in iter_checkpoint(folder):
        layer = _layer_of(name)
        if _MTP.search(name) or (
            layer is not None and layer >= num_hidden_layers and "vision" not in name
        ):
            report.mtp_tensors += 1
            continue
        if family == "minimax_m3" and _VISION.match(name):
            report.vision_tensors += 1
            continue
        if name.endswith(_SCALE):
            scales[name[: -len(_SCALE)] + "weight"] = tensor
            continue
        raw[name] = tensor

    singles: dict[str, torch.Tensor] = {}
    cats: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
    experts: dict[str, dict[str, dict[int, torch.Tensor]]] = defaultdict(lambda: defaultdict(dict))
    unexpected: list[str] = []
    for name, tensor in raw.items():
        target = mapper(name)
        if target is None:
            unexpected.append(name)
            continue
        value = _convert(name, tensor, scales.get(name), block, dtype, report)
        if target.kind == "copy":
            singles[target.key] = value
        elif target.kind == "cat":
            cats[target.key][int(target.part)] = value
        else:
            experts[target.key][str(target.part)][target.index] = value

    state: dict[str, torch.Tensor] = dict(singles)
    missing_parts: list[str] = []
    for key, halves in cats.items():
        if set(halves) != {0, 1}:
            missing_parts.append(f"{key} ({'up_proj' if 0 in halves else 'gate_proj'})")
            continue
        state[key] = torch.cat([halves[0], halves[1]], dim=0)
    for key, parts in experts.items():
        names = ("down",) if key.endswith("down_proj") else ("gate", "up")
        for part in names:
            have: dict[int, torch.Tensor] = parts.get(part, {})
            lacking = [e for e in range(num_experts) if e not in have]
            if lacking:
                w = {"gate": "w1", "up": "w3", "down": "w2"}[part]
                missing_parts.append(
                    f"{key} (expert {lacking[0]}'s {w}{f' and {len(lacking) - 1} more' if len(lacking) > 1 else ''})"
                )
        if missing_parts:
            continue
        if key.endswith("down_proj"):
            state[key] = torch.stack([parts["down"][e] for e in range(num_experts)])
        else:
            state[key] = torch.stack(
                [torch.cat([parts["gate"][e], parts["up"][e]], dim=0) for e in range(num_experts)]
            )
        extra = [e for p in parts.values() for e in p if e >= num_experts]
        if extra:
            unexpected.append(f"{key} expert {min(extra)}")
    if missing_parts:
        raise MiniMaxWeightsError(
            f"the checkpoint lacks weights for {_where(missing_parts)}: the download is "
            "incomplete or config.json does not match the weights; re-download the model"
        )
    unexpected += sorted(k for k in state if k not in expected)
    if unexpected:
        raise MiniMaxWeightsError(
            f"the checkpoint has weights config.json does not describe, for {_where(sorted(unexpected))}: "
            "the folder mixes two checkpoints; re-download the model"
        )
    missing = sorted(k for k in expected if k not in state)
    if missing:
        raise MiniMaxWeightsError(
            f"the checkpoint lacks weights for {_where(missing)}: the download is incomplete "
            "or config.json does not match the weights; re-download the model"
        )
    for key, shape in expected.items():
        if tuple(state[key].shape) != tuple(shape):
            raise MiniMaxWeightsError(
                f"weight {key} is {list(state[key].shape)} in the checkpoint but config.json "
                f"makes it {list(shape)}: the folder mixes two checkpoints; re-download the model"
            )
    if report.dequantized:
        report.block = block
    return state, report


def _convert(
    name: str,
    tensor: torch.Tensor,
    scale: torch.Tensor | None,
    block: tuple[int, int],
    dtype: torch.dtype,
    report: LoadReport,
) -> torch.Tensor:
    # The reader paired every scale with its FP8 weight (and every FP8 weight with one).
    if scale is None:
        return tensor.to(dtype) if tensor.is_floating_point() else tensor
    if tensor.dim() != 2:
        raise MiniMaxWeightsError(
            f"{name} has a {_SCALE} but is not a matrix: re-download the model"
        )
    try:
        value = dequantize_fp8_blocks(tensor, scale, block, dtype)
    except ValueError as err:
        raise MiniMaxWeightsError(
            f"{name}: {err}: the FP8 checkpoint is damaged; re-download the model"
        ) from err
    report.dequantized += 1
    return value
