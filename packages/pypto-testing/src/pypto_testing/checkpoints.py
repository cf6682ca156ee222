"""Sharded safetensors folders, and the edits hostile-folder tests make to them.

The family builders (``pypto_testing.minimax``, ``pypto_testing.kimi``) write their
checkpoints with :func:`write_sharded`; tests that break a folder find a tensor's shard
with :func:`shard_of` and rewrite it with :func:`rewrite_shard` (real safetensors files,
as a damaged or mixed download would leave them). Torch-free tests write files byte by
byte with :func:`safetensors_bytes`. safetensors and torch are imported lazily.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "index_of",
    "other_shard",
    "poison",
    "rewrite_shard",
    "safetensors_bytes",
    "shard_of",
    "write_sharded",
]

INDEX = "model.safetensors.index.json"
_ELEMENT_BYTES = {"F64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "U8": 1}


def safetensors_bytes(tensors: Mapping[str, tuple[str, Sequence[int]]], fill: int = 0x3F) -> bytes:
    """A valid safetensors file without torch: each tensor ``(dtype, shape)`` filled with
    the byte ``fill``."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    data = bytearray()
    for name, (dtype, shape) in tensors.items():
        n = _ELEMENT_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [len(data), len(data) + n],
        }
        data += bytes([fill]) * n
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(data)


def write_sharded(path: Path, tensors: dict[str, Any], shards: int) -> None:
    """``tensors`` in ``shards`` files named as the hub names them, with the index when
    there is more than one (``model.safetensors`` alone otherwise)."""
    from safetensors.torch import save_file

    names = sorted(tensors)
    per = -(-len(names) // max(1, shards))
    groups = [names[i : i + per] for i in range(0, len(names), per)]
    weight_map: dict[str, str] = {}
    total = 0
    for n, group in enumerate(groups, start=1):
        fname = (
            "model.safetensors"
            if len(groups) == 1
            else f"model-{n:05d}-of-{len(groups):05d}.safetensors"
        )
        part = {k: tensors[k].contiguous() for k in group}
        save_file(part, str(path / fname), metadata={"format": "pt"})
        for k in group:
            weight_map[k] = fname
            total += part[k].numel() * part[k].element_size()
    if len(groups) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def index_of(folder: Path) -> dict[str, Any]:
    """The folder's ``model.safetensors.index.json``."""
    data: dict[str, Any] = json.loads((folder / INDEX).read_text())
    return data


def shard_of(folder: Path, key: str) -> Path:
    """The shard the index says holds ``key``."""
    return folder / index_of(folder)["weight_map"][key]


def other_shard(folder: Path, key: str) -> Path:
    """A shard of the folder that does not hold ``key``."""
    return next(p for p in sorted(folder.glob("model-*.safetensors")) if p != shard_of(folder, key))


def rewrite_shard(shard: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    """Load ``shard``, let ``change`` edit its tensors in place, save it again."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(shard))
    change(tensors)
    save_file(tensors, str(shard), metadata={"format": "pt"})


def poison(folder: Path, key: str, values: Mapping[tuple[int, ...], float]) -> Path:
    """Set elements of tensor ``key`` (index -> value, e.g. ``{(0, 0): nan}``) in the shard
    that holds it, as a damaged download would; returns that shard."""
    shard = shard_of(folder, key)

    def change(tensors: dict[str, Any]) -> None:
        tensors[key] = tensors[key].clone()
        for index, value in values.items():
            tensors[key][index] = value

    rewrite_shard(shard, change)
    return shard
