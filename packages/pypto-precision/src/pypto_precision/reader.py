"""Read a dump folder, written by a stranger: every path, count and number is checked.

A dump travels between machines (made on an NPU host, compared on a laptop), so the folder
is untrusted: ``index.json`` is read as a regular file with a byte bound and a depth bound,
only the keys this format defines are accepted, counts are bounded before anything is
allocated by them, tensor files must be regular files named as this package names them
and resolve inside the folder, and a tensor whose shape or dtype disagrees with the index
is refused. Every refusal is a :class:`BadDumpError` with one line naming the problem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pypto_common import UntrustedFileError, loads_bounded, read_regular_file
from pypto_common.visible import has_invisible

from .dump import FORMAT, INDEX, MODES, VERSION, Entry
from .errors import BadDumpError
from .stats import STAT_KEYS, dtype_name

__all__ = ["MAX_ENTRIES", "MAX_INDEX_BYTES", "Dump", "read_index_dump"]

MAX_INDEX_BYTES = 512 << 20
MAX_ENTRIES = 2_000_000
_MAX_NAME = 1024
#: Control (C0, C1) and Unicode bidi characters: no module name holds them.
_MAX_DIMS = 16
_MAX_DIM = 1 << 48
_SHARD = re.compile(r"tensors-\d{5}\.safetensors")
_KEY = re.compile(r"e\d{9}")
_MD5 = re.compile(r"[0-9a-f]{32}")
_TOP_KEYS = {"format", "version", "mode", "with_inputs", "meta", "entries"}
_ENTRY_KEYS = {"name", "call", "io", "index", "order", "shape", "dtype", "stats", "md5", "file",
               "key", "cls"}  # fmt: skip
_CLS = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_DTYPES = {
    dtype_name(d): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


@dataclass
class Dump:
    """A dump read and checked: its mode, what was run (``meta``) and its entries."""

    folder: Path
    mode: str
    meta: dict[str, Any]
    entries: list[Entry]
    source: str = FORMAT

    def has_tensors(self) -> bool:
        return self.mode == "tensor"

    def tensor(self, entry: Entry) -> torch.Tensor:
        """The recorded tensor of ``entry`` (tensor mode), checked against the index."""
        if entry.file is None or entry.key is None:
            raise BadDumpError(f"{self.folder}: {entry.id} has no tensor: a {self.mode} dump")
        path = _inside(self.folder, entry.file)
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as fh:
                if entry.key not in fh.keys():  # noqa: SIM118 (safe_open has no __contains__)
                    raise BadDumpError(
                        f"{path}: has no tensor {entry.key} for {entry.id}: the dump is "
                        "incomplete; dump again"
                    )
                t = fh.get_tensor(entry.key)
        except BadDumpError:
            raise
        except Exception as err:  # safetensors' own header and bounds errors
            raise BadDumpError(
                f"{path}: not a readable safetensors file ({' '.join(str(err).split())[:120]})"
            ) from None
        if list(t.shape) != entry.shape or dtype_name(t.dtype) != entry.dtype:
            raise BadDumpError(
                f"{path}: {entry.key} is {dtype_name(t.dtype)}{list(t.shape)}, the index says "
                f"{entry.dtype}{entry.shape}: the dump was altered; dump again"
            )
        return t


def _inside(folder: Path, name: str) -> Path:
    """``folder/name`` as a regular file that resolves inside ``folder``."""
    if not _SHARD.fullmatch(name):
        raise BadDumpError(f"{folder}: names a tensor file {name[:80]!r} this format never writes")
    path = folder / name
    resolved = path.resolve()
    if resolved.parent != folder.resolve():
        raise BadDumpError(f"{path}: resolves outside the dump folder; refused")
    if not resolved.is_file() or path.is_symlink():
        raise BadDumpError(f"{path}: not a regular file in the dump; refused")
    return path


def _fail(folder: Path, what: str) -> BadDumpError:
    return BadDumpError(f"{folder / INDEX}: {what}: not a dump this tool can read")


def _int(folder: Path, value: Any, what: str, hi: int) -> int:
    if type(value) is not int or not 0 <= value <= hi:
        raise _fail(folder, f"{what} must be an integer 0..{hi}")
    return value


def _entry(folder: Path, raw: Any, position: int, n: int) -> Entry:
    if not isinstance(raw, dict) or not set(raw) <= _ENTRY_KEYS:
        extra = sorted(set(raw) - _ENTRY_KEYS)[:3] if isinstance(raw, dict) else []
        raise _fail(folder, f"entry {position} is not an entry object {extra or ''}".rstrip())
    name = raw.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME:
        raise _fail(folder, f"entry {position}'s name must be text of 1..{_MAX_NAME} characters")
    if has_invisible(name):
        # A module name is printed on the terminal and drawn in the pages: an escape
        # sequence or a bidi override in it retitled the terminal and spoofed the page.
        raise _fail(folder, f"entry {position}'s name holds control, bidi or invisible characters")
    if raw.get("io") not in ("input", "output"):
        raise _fail(folder, f"entry {position}'s io must be input or output")
    shape = raw.get("shape")
    if not isinstance(shape, list) or len(shape) > _MAX_DIMS:
        raise _fail(folder, f"entry {position}'s shape must be a list of at most {_MAX_DIMS}")
    dims = [_int(folder, d, f"entry {position}'s shape", _MAX_DIM) for d in shape]
    dtype = raw.get("dtype")
    if dtype not in _DTYPES:
        raise _fail(folder, f"entry {position}'s dtype {str(dtype)[:20]!r} is not one it knows")
    stats = raw.get("stats")
    if not isinstance(stats, dict) or not set(stats) <= set(STAT_KEYS):
        raise _fail(folder, f"entry {position}'s stats must hold only {', '.join(STAT_KEYS)}")
    for key, value in stats.items():
        if value is not None and (type(value) not in (int, float) or isinstance(value, bool)):
            raise _fail(folder, f"entry {position}'s stats.{key} must be a number or null")
    md5 = raw.get("md5")
    if md5 is not None and (not isinstance(md5, str) or not _MD5.fullmatch(md5)):
        raise _fail(folder, f"entry {position}'s md5 must be 32 hex digits")
    file, key = raw.get("file"), raw.get("key")
    if (file is None) != (key is None):
        raise _fail(folder, f"entry {position} must give both file and key, or neither")
    if file is not None and (
        not isinstance(file, str) or not _SHARD.fullmatch(file)
        or not isinstance(key, str) or not _KEY.fullmatch(key)
    ):  # fmt: skip
        raise _fail(folder, f"entry {position}'s file / key are not names this format writes")
    cls = raw.get("cls")
    if cls is not None and (not isinstance(cls, str) or not _CLS.fullmatch(cls)):
        raise _fail(folder, f"entry {position}'s cls must be a Python class name")
    return Entry(
        name=name,
        call=_int(folder, raw.get("call"), f"entry {position}'s call", n),
        io=raw["io"],
        index=_int(folder, raw.get("index"), f"entry {position}'s index", 1 << 16),
        order=_int(folder, raw.get("order"), f"entry {position}'s order", n),
        shape=dims,
        dtype=dtype,
        stats=dict(stats),
        md5=md5,
        file=file,
        key=key,
        cls=cls,
    )


def read_index_dump(root: Path) -> Dump:
    """This package's dump in ``root`` (its ``index.json``), checked."""
    try:
        data = loads_bounded(read_regular_file(root / INDEX, MAX_INDEX_BYTES))
    except (UntrustedFileError, OSError) as err:
        raise BadDumpError(f"{root / INDEX}: {' '.join(str(err).split())[:160]}") from None
    if not isinstance(data, dict) or not set(data) <= _TOP_KEYS:
        raise _fail(root, "the top level is not this format's object")
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise _fail(root, f"format must be {FORMAT!r} version {VERSION}")
    mode = data.get("mode")
    if mode not in MODES:
        raise _fail(root, f"mode must be one of {', '.join(MODES)}")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise _fail(root, "meta must be an object")
    raw_entries = data.get("entries")
    if not isinstance(raw_entries, list):
        raise _fail(root, "entries must be a list")
    if len(raw_entries) > MAX_ENTRIES:
        raise _fail(root, f"holds {len(raw_entries)} entries, more than {MAX_ENTRIES}")
    n = len(raw_entries)
    entries = [_entry(root, raw, i, n) for i, raw in enumerate(raw_entries)]
    ids = {e.id for e in entries}
    if len(ids) != len(entries):
        raise _fail(root, "two entries share one name, call, io and index")
    if mode == "tensor" and any(e.file is None for e in entries):
        raise _fail(root, "a tensor-mode entry has no tensor file")
    return Dump(folder=root, mode=mode, meta=meta, entries=sorted(entries, key=lambda e: e.order))
