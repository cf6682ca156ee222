"""The layout of a safetensors checkpoint folder, read strictly and without torch.

A model folder is untrusted (a stranger's repo, or a folder of links made by an
overlay), so every tool that reads weights itself (the strict family loaders, the
bench's size check) reads the folder through :func:`read_checkpoint`, which decides
once, for all of them:

* which shards: the ones ``model.safetensors.index.json`` names (a stray file beside
  them is ignored), else ``model.safetensors``, else every ``*.safetensors``;
* where they may be: a shard name is a plain file name inside the folder, the file is a
  regular file (never a FIFO, a device or a folder), and a symbolic link is followed
  only when the caller vouches for it (``links``: the links a pypto-patch overlay
  records, from ``pypto_patch.overlay_links``) and points exactly where it was recorded
  to, at a regular file;
* what they hold: each header (8-byte little-endian length + JSON) read with bounded
  reads and checked (known dtypes, sizes that match the shapes, data inside the file);
  a tensor stored twice (in two shards, or twice in one header) is refused, never
  "last one wins";
* how block scales pair with weights: a ``weight_scale_inv`` belongs to an FP8 weight
  beside it and is a float; an FP8 weight has one. Anything else would be dequantised
  wrongly (a scale beside a bf16 weight makes it ~1000x too large).

Each problem is one :class:`CheckpointError` line naming the tensor and the shard, and
the fix. Values (NaN / inf) need the tensors themselves: torch-level readers check them
(``pypto_capture.weights``). Nothing here writes. Standard library only.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FETCH_OPTIONS",
    "FP8_DTYPES",
    "INDEX_NAME",
    "MAX_HEADER_BYTES",
    "MAX_INDEX_BYTES",
    "REDOWNLOAD",
    "SCALE_DTYPES",
    "SCALE_SUFFIX",
    "SINGLE_NAME",
    "Checkpoint",
    "CheckpointError",
    "LoadOptions",
    "TensorEntry",
    "dtype_bits",
    "read_checkpoint",
    "read_header",
    "split_load_options",
]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
SCALE_SUFFIX = "weight_scale_inv"
#: safetensors' own limit on a header.
MAX_HEADER_BYTES = 100_000_000
#: An index lists tensor names: tens of thousands of lines for the largest releases.
MAX_INDEX_BYTES = 64 * 2**20
#: The fix for a damaged or mixed download, as every message here words it.
REDOWNLOAD = "re-download the model"

# Bits per element of every dtype the safetensors format names.
_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip
#: Weights stored as FP8 that need a block scale to mean anything.
FP8_DTYPES = frozenset({"F8_E4M3", "F8_E5M2"})
#: What a block scale may be stored as.
SCALE_DTYPES = frozenset({"F32", "F16", "BF16", "F64"})

#: ``from_pretrained`` options that only say where or how to fetch files: a strict loader
#: of a local folder accepts and ignores them.
FETCH_OPTIONS = frozenset(
    {
        "local_files_only",
        "trust_remote_code",
        "revision",
        "code_revision",
        "cache_dir",
        "force_download",
        "proxies",
        "token",
        "subfolder",
        "_commit_hash",
        "_from_auto",
        "_from_pipeline",
        "adapter_kwargs",
        "use_safetensors",
        "low_cpu_mem_usage",
        "key_mapping",
        "resume_download",
        "trust_remote_code_hash",
    }
)


class CheckpointError(RuntimeError):
    """The folder's weights cannot be read as one checkpoint; ``str()`` is one line naming
    the tensor or file, the problem and the fix."""


def dtype_bits(dtype: str) -> int | None:
    """Bits per element of a safetensors dtype name (``"BF16"`` -> 16), None if unknown."""
    return _BITS.get(dtype)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as its shard's header declares it."""

    name: str
    shard: str  #: the shard's file name, as the folder names it
    dtype: str  #: the safetensors dtype name ("BF16", "F8_E4M3", ...)
    shape: tuple[int, ...]
    nbytes: int  #: bytes it occupies in the file

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class Checkpoint:
    """The checked layout of a folder's weights (see the module docstring)."""

    folder: Path
    #: shard file name -> the regular file to open (the recorded target for an overlay link)
    shards: dict[str, Path]
    tensors: dict[str, TensorEntry] = field(default_factory=dict)
    indexed: bool = False  #: the shard list came from model.safetensors.index.json

    def by_shard(self) -> dict[str, list[TensorEntry]]:
        """The tensors of each shard, in header order, shards in file-name order."""
        out: dict[str, list[TensorEntry]] = {name: [] for name in self.shards}
        for entry in self.tensors.values():
            out[entry.shard].append(entry)
        return out


# --- opening files ------------------------------------------------------------------------


def _plain_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and bool(name)
        and "/" not in name
        and "\\" not in name
        and "\x00" not in name
        and not name.startswith(".")
    )


def _regular(folder: Path, name: str, links: Mapping[str, Path | str], what: str) -> Path:
    """The regular file ``folder/name`` stands for: itself, or a vouched-for link's target.

    Raises CheckpointError for anything else (a FIFO, a folder, a link nobody recorded,
    a recorded link that now points elsewhere).
    """
    path = folder / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CheckpointError(
            f"{what} {name} of {folder} is missing: the download is incomplete; {REDOWNLOAD}"
        ) from None
    except OSError as err:
        raise CheckpointError(
            f"{what} {name} in {folder} is unreadable ({err.strerror or err}): {REDOWNLOAD}"
        ) from None
    if stat.S_ISLNK(st.st_mode):
        recorded = links.get(name)
        try:
            target = os.readlink(path)
        except OSError:
            target = None
        if recorded is None or target != os.fspath(recorded):
            raise CheckpointError(
                f"{what} {name} in {folder} is a symbolic link no pypto-patch overlay of this "
                f"folder records (it points to {str(target)[:200]!r}): put the real file there "
                "(pypto-download writes real files; a hub-cache snapshot holds links), or "
                "rebuild the overlay with pypto-patch"
            )
        path = Path(recorded)
        try:
            st = os.lstat(path)
        except OSError as err:
            raise CheckpointError(
                f"{what} {name} in {folder} links to {path}, which is unreadable "
                f"({err.strerror or err}): the overlay's source folder changed; rebuild the "
                "overlay with pypto-patch"
            ) from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(
            f"{what} {name} in {folder} is not a regular file: put the real file there; "
            f"{REDOWNLOAD}"
        )
    return path


def _read_bounded(path: Path, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` of a regular file, opened without following a link."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        chunks: list[bytes] = []
        got = 0
        while got < size:
            chunk = os.pread(fd, min(size - got, 1 << 24), offset + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _loads(raw: bytes) -> Any:
    return json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)


# --- the index and the headers ------------------------------------------------------------


def _index_shards(folder: Path, links: Mapping[str, Path | str]) -> list[str]:
    path = _regular(folder, INDEX_NAME, links, "the index")
    try:
        raw = _read_bounded(path, 0, MAX_INDEX_BYTES + 1)
        if len(raw) > MAX_INDEX_BYTES:
            raise ValueError(f"larger than {MAX_INDEX_BYTES} bytes")
        data = _loads(raw)
        weight_map = data["weight_map"]
        names = sorted(set(weight_map.values()))
    except _DuplicateKey as err:
        raise CheckpointError(
            f"{folder / INDEX_NAME} lists {err.key!r} twice: the folder mixes two downloads; "
            f"{REDOWNLOAD}"
        ) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        raise CheckpointError(
            f"{folder / INDEX_NAME} is unreadable ({type(err).__name__}): {REDOWNLOAD}"
        ) from None
    for name in names:
        if not _plain_name(name) or not str(name).endswith(".safetensors"):
            raise CheckpointError(
                f"{folder / INDEX_NAME} names shard {str(name)[:120]!r} outside the folder: "
                f"{REDOWNLOAD}"
            )
    return [str(n) for n in names]


def read_header(path: Path, shard: str) -> list[TensorEntry]:
    """The tensors a safetensors file declares, checked against the file's size.

    ``path`` must be a regular file; ``shard`` is the name used in messages.
    """
    bad = f"{shard} is not a readable safetensors file"
    try:
        size = os.stat(path).st_size
        head = _read_bounded(path, 0, 8)
        if len(head) < 8:
            raise CheckpointError(f"{bad} (shorter than its header): {REDOWNLOAD}")
        length = int.from_bytes(head, "little")
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise CheckpointError(
                f"{bad} (its header claims {length} bytes, the file has {size}): {REDOWNLOAD}"
            )
        raw = _read_bounded(path, 8, length)
        if len(raw) != length:
            raise CheckpointError(f"{bad} (truncated header): {REDOWNLOAD}")
        header = _loads(raw)
    except CheckpointError:
        raise
    except _DuplicateKey as err:
        raise CheckpointError(
            f"weight {err.key[:200]} is stored twice in {shard}: the file is damaged; {REDOWNLOAD}"
        ) from None
    except (OSError, ValueError, RecursionError) as err:
        raise CheckpointError(f"{bad} ({type(err).__name__}): {REDOWNLOAD}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{bad} (its header is not a JSON object): {REDOWNLOAD}")
    data_size = size - 8 - length
    entries: list[TensorEntry] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        entries.append(_entry(shard, name, info, data_size, bad))
    return entries


def _entry(shard: str, name: str, info: Any, data_size: int, bad: str) -> TensorEntry:
    shown = name[:200]
    if not isinstance(info, dict):
        raise CheckpointError(f"{bad} (tensor {shown} has no description): {REDOWNLOAD}")
    dtype: Any = info.get("dtype")
    shape: Any = info.get("shape")
    offsets: Any = info.get("data_offsets")
    bits = dtype_bits(dtype) if isinstance(dtype, str) else None
    if bits is None:
        raise CheckpointError(
            f"weight {shown} in {shard} has the unknown dtype {str(dtype)[:40]!r}: {REDOWNLOAD}"
        )
    ok_shape = isinstance(shape, list) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    )
    ok_offsets = (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_size
    )
    if not ok_shape or not ok_offsets or len(shape) > 64:
        raise CheckpointError(
            f"{bad} (tensor {shown} has a malformed shape or data offsets): {REDOWNLOAD}"
        )
    entry = TensorEntry(name, shard, dtype, tuple(shape), offsets[1] - offsets[0])
    if (entry.numel * bits + 7) // 8 != entry.nbytes:
        raise CheckpointError(
            f"{bad} (tensor {shown} is {list(shape)} {dtype} but holds {entry.nbytes} bytes): "
            f"{REDOWNLOAD}"
        )
    return entry


# --- the whole folder ---------------------------------------------------------------------


def _shard_names(folder: Path, links: Mapping[str, Path | str]) -> tuple[list[str], bool]:
    if os.path.lexists(folder / INDEX_NAME):
        return _index_shards(folder, links), True
    if os.path.lexists(folder / SINGLE_NAME):
        return [SINGLE_NAME], False
    found = sorted(p.name for p in folder.glob("*.safetensors") if _plain_name(p.name))
    if not found:
        raise CheckpointError(
            f"{folder} holds no safetensors weights: download the checkpoint's *.safetensors files"
        )
    return found, False


def _check_scales(tensors: Mapping[str, TensorEntry]) -> None:
    """Every block scale beside the FP8 weight it scales, as a float; every FP8 weight
    with its scale."""
    for name, entry in tensors.items():
        if name.endswith(SCALE_SUFFIX):
            wname = name[: -len(SCALE_SUFFIX)] + "weight"
            weight = tensors.get(wname)
            if weight is None:
                raise CheckpointError(
                    f"the checkpoint has {name} (in {entry.shard}) but no {wname}: the download "
                    f"is incomplete; {REDOWNLOAD}"
                )
            if entry.dtype not in SCALE_DTYPES:
                raise CheckpointError(
                    f"{name} in {entry.shard} is stored as {entry.dtype}, not a float: a block "
                    f"scale must be F32/BF16/F16; the FP8 checkpoint is damaged; {REDOWNLOAD}"
                )
            if weight.dtype not in FP8_DTYPES:
                raise CheckpointError(
                    f"{name} in {entry.shard} scales {wname} (in {weight.shard}), which is "
                    f"stored in {weight.dtype}, not FP8: applying it would corrupt the weight; "
                    f"the folder mixes the FP8 and unquantised releases; {REDOWNLOAD}"
                )
        elif entry.dtype in FP8_DTYPES and not name.endswith(SCALE_SUFFIX):
            scale = name[: -len("weight")] + SCALE_SUFFIX if name.endswith("weight") else None
            if scale is None or scale not in tensors:
                raise CheckpointError(
                    f"{name} in {entry.shard} is stored in {entry.dtype} without its "
                    f"{SCALE_SUFFIX}: the download is incomplete; {REDOWNLOAD}"
                )


def read_checkpoint(
    folder: str | os.PathLike[str], *, links: Mapping[str, Path | str] | None = None
) -> Checkpoint:
    """The checked layout of ``folder``'s safetensors weights (see the module docstring).

    ``links``: file name -> the exact target of each symbolic link that may be followed
    (``pypto_patch.overlay_links(folder)``); no other link is. Raises
    :class:`CheckpointError` (one line) on anything that does not fit.
    """
    root = Path(os.path.abspath(os.fspath(folder)))
    vouched: Mapping[str, Path | str] = links or {}
    names, indexed = _shard_names(root, vouched)
    ckpt = Checkpoint(root, {}, {}, indexed)
    for name in names:
        ckpt.shards[name] = _regular(root, name, vouched, "shard")
    for name, path in ckpt.shards.items():
        for entry in read_header(path, name):
            earlier = ckpt.tensors.get(entry.name)
            if earlier is not None:
                raise CheckpointError(
                    f"weight {entry.name[:200]} is stored twice (in {earlier.shard} and {name}): "
                    f"the folder mixes two downloads; {REDOWNLOAD}"
                )
            ckpt.tensors[entry.name] = entry
    _check_scales(ckpt.tensors)
    return ckpt


# --- from_pretrained options --------------------------------------------------------------


@dataclass
class LoadOptions:
    """What a strict loader of a local folder takes from ``from_pretrained``'s options."""

    config: Any = None
    attn_implementation: Any = None
    experts_implementation: Any = None
    device_map: Any = None
    dtype: dict[str, Any] = field(default_factory=dict)  #: "dtype"/"torch_dtype" as given
    output_loading_info: bool = False
    unsupported: list[str] = field(default_factory=list)  #: options it cannot honour


def split_load_options(kwargs: Mapping[str, Any], *, ignored: Iterable[str] = ()) -> LoadOptions:
    """``kwargs`` sorted into what the loader uses, what only says where to fetch files
    (:data:`FETCH_OPTIONS` and ``ignored``: dropped) and what it does not support."""
    rest = dict(kwargs)
    opts = LoadOptions(
        config=rest.pop("config", None),
        attn_implementation=rest.pop("attn_implementation", None),
        experts_implementation=rest.pop("experts_implementation", None),
        device_map=rest.pop("device_map", None),
        dtype={k: rest.pop(k) for k in ("dtype", "torch_dtype") if k in rest},
        output_loading_info=bool(rest.pop("output_loading_info", False)),
    )
    skip = FETCH_OPTIONS | frozenset(ignored)
    opts.unsupported = sorted(k for k in rest if k not in skip)
    return opts
