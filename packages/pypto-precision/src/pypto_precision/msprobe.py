"""msprobe's dump layout, read as either side of a compare and written for ``msprobe compare``.

msprobe (PyPI ``mindstudio-probe``) is what Ascend users already run: its module-level
(``level="L0"``) dump is ``step<N>/proc<pid>/dump.json`` (``{task, level, framework,
dump_data_dir, data}``; ``data`` maps ``Module.<name>.<Class>.forward.<call>`` to its
``input_args`` / ``input_kwargs`` / ``output`` tensor records with dtype, shape, Max, Min,
Mean, Norm and, in tensor mode, a ``data_name`` under ``dump_tensor_data/``), plus
``construct.json`` and ``stack.json``. Its entries are aligned with ours by module name and
call, so an msprobe dump of the reference compares with a pypto-precision dump of the
target, and the other way round. The layout was read off mindstudio-probe 26.2.0's own
output (the nox session ``msprobe`` proves both directions with the real tool).

Like our own dumps, an msprobe folder is untrusted: ``dump.json`` is bounded in bytes and
depth (a NaN or inf statistic is read as missing, not a crash), only ``Module.*.forward.*``
keys are taken, tensor files must be plain names inside ``dump_tensor_data`` and are loaded
with ``torch.load(weights_only=True)`` after a byte bound.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import torch

from pypto_common import UntrustedFileError, atomic_write_text, loads_bounded, read_regular_file
from pypto_common.visible import has_invisible

from .dump import Entry
from .errors import BadDumpError, PrecisionError
from .reader import MAX_ENTRIES, MAX_INDEX_BYTES, Dump

__all__ = ["MSPROBE", "find_msprobe_dump", "read_msprobe", "write_msprobe"]

MSPROBE = "msprobe"
_MAX_TENSOR_FILE = 8 << 30
_KEY = re.compile(
    r"Module\.(?P<name>.+)"
    r"\.(?P<cls>[A-Za-z_][A-Za-z0-9_]*)\.forward\.(?P<call>\d{1,9})"
)
_DATA_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,512}\.pt")
_MAX_DEPTH = 64
_TORCH_DTYPES = {
    f"torch.{n}": n
    for n in (
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
    )
}


def find_msprobe_dump(root: Path) -> Path | None:
    """The folder holding ``dump.json`` at or under ``root`` (``root``, its one
    ``proc*``/``rank*``, or its one ``step*`` holding one of those); None when absent.
    Several candidates are refused: the user must say which."""
    if (root / "dump.json").exists() or (root / "dump.json").is_symlink():
        return root
    for depth in (1, 2):
        pattern = "*/dump.json" if depth == 1 else "*/*/dump.json"
        found = sorted(p.parent for p in root.glob(pattern))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            shown = ", ".join(str(p.relative_to(root)) for p in found[:4])
            raise BadDumpError(
                f"{root}: holds {len(found)} msprobe dumps ({shown}): pass one of those folders"
            )
    return None


def _load_json(path: Path) -> Any:
    try:
        # msprobe writes NaN / Infinity for a tensor that holds them: read as missing.
        return loads_bounded(read_regular_file(path, MAX_INDEX_BYTES), max_depth=_MAX_DEPTH,
                             max_int_digits=20, nonfinite_as_null=True)  # fmt: skip
    except (UntrustedFileError, OSError) as err:
        raise BadDumpError(f"{path}: {' '.join(str(err).split())[:160]}") from None


def _stat(value: Any) -> float | None:
    if type(value) in (int, float) and value == value and abs(value) != float("inf"):
        return float(value)
    return None


class _MsprobeDump(Dump):
    """A :class:`Dump` read from msprobe's layout; tensors are its ``.pt`` files."""

    data_dir: Path

    def tensor(self, entry: Entry) -> torch.Tensor:
        if entry.file is None:
            raise BadDumpError(f"{self.folder}: {entry.id} has no tensor: a {self.mode} dump")
        path = self.data_dir / entry.file
        if path.resolve().parent != self.data_dir.resolve() or path.is_symlink():
            raise BadDumpError(f"{path}: resolves outside the dump's tensor folder; refused")
        try:
            raw = read_regular_file(path, _MAX_TENSOR_FILE)
            t = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        except (UntrustedFileError, OSError) as err:
            raise BadDumpError(f"{path}: {' '.join(str(err).split())[:160]}") from None
        except Exception as err:  # torch.load's refusal of anything but plain tensors
            raise BadDumpError(
                f"{path}: not a plain tensor file ({' '.join(str(err).split())[:120]})"
            ) from None
        if not isinstance(t, torch.Tensor) or list(t.shape) != entry.shape:
            raise BadDumpError(f"{path}: not the {entry.shape} tensor dump.json names; refused")
        return t


def read_msprobe(folder: Path) -> Dump:
    """The msprobe dump whose ``dump.json`` is in ``folder``, as a :class:`Dump`."""
    data = _load_json(folder / "dump.json")
    if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
        raise BadDumpError(f"{folder / 'dump.json'}: has no data object: not an msprobe dump")
    records = data["data"]
    if len(records) > MAX_ENTRIES:
        raise BadDumpError(f"{folder / 'dump.json'}: {len(records)} records, over {MAX_ENTRIES}")
    task = data.get("task")
    entries: list[Entry] = []
    skipped = 0
    for key, record in records.items():
        m = _KEY.fullmatch(str(key))
        if m is not None and has_invisible(m["name"]):
            # No control, bidi or invisible character in a name: they retitled the
            # terminal, spoofed pages and made two names look the same.
            m = None
        if m is None or not isinstance(record, dict):
            skipped += 1  # API-level (L1) records and anything else: not aligned with modules
            continue
        for io_name, values in (
            ("input", [record.get("input_args"), record.get("input_kwargs")]),
            ("output", [record.get("output")]),
        ):
            for index, item in enumerate(_tensor_records(values)):
                if len(entries) >= MAX_ENTRIES:
                    raise BadDumpError(f"{folder / 'dump.json'}: more than {MAX_ENTRIES} tensors")
                entries.append(_entry(folder, m, io_name, index, item, len(entries)))
    mode = "tensor" if task == "tensor" and all(e.file for e in entries) else "statistics"
    meta = {"framework": data.get("framework"), "task": task, "level": data.get("level")}
    dtypes = {e.dtype for e in entries if e.io == "output" and e.dtype.startswith(("float", "b"))}
    meta["dtype"] = dtypes.pop() if len(dtypes) == 1 else None
    dump = _MsprobeDump(folder=folder, mode=mode, meta=meta, entries=entries, source=MSPROBE)
    dump.data_dir = folder / "dump_tensor_data"
    if not entries:
        raise BadDumpError(
            f"{folder / 'dump.json'}: no module records (Module.<name>.<Class>.forward.<n>): "
            f"dump with level='L0' or 'mix' ({skipped} other records)"
        )
    return dump


def _tensor_records(values: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def walk(v: Any, depth: int) -> None:
        if depth > 8 or len(out) >= 256:
            return
        if isinstance(v, dict) and v.get("type") == "torch.Tensor":
            out.append(v)
        elif isinstance(v, dict):
            for item in v.values():
                walk(item, depth + 1)
        elif isinstance(v, list):
            for item in v:
                walk(item, depth + 1)

    for v in values:
        walk(v, 0)
    return out


def _entry(folder: Path, m: re.Match[str], io_name: str, index: int, rec: dict[str, Any],
           order: int) -> Entry:  # fmt: skip
    where = f"{folder / 'dump.json'}: {m.group(0)[:120]}"
    dtype = _TORCH_DTYPES.get(str(rec.get("dtype")))
    shape = rec.get("shape")
    if dtype is None:
        raise BadDumpError(f"{where}: dtype {str(rec.get('dtype'))[:30]!r} is not one it knows")
    if (
        not isinstance(shape, list)
        or len(shape) > 16
        or not all(type(d) is int and 0 <= d <= 1 << 48 for d in shape)
    ):
        raise BadDumpError(f"{where}: shape must be a list of at most 16 sizes")
    data_name = rec.get("data_name")
    if data_name is not None and (
        not isinstance(data_name, str) or not _DATA_NAME.fullmatch(data_name)
    ):
        raise BadDumpError(f"{where}: data_name {str(data_name)[:60]!r} is not a plain .pt name")
    stats = {"min": _stat(rec.get("Min")), "max": _stat(rec.get("Max")),
             "mean": _stat(rec.get("Mean")), "norm": _stat(rec.get("Norm"))}  # fmt: skip
    return Entry(
        name=m.group("name")[:1024],
        call=int(m.group("call")),
        io=io_name,
        index=index,
        order=order,
        shape=list(shape),
        dtype=dtype,
        stats=stats,
        file=data_name,
        key=None,
        cls=m.group("cls"),
    )


def write_msprobe(dump: Dump, out: str | Path) -> Path:
    """Write ``dump`` in msprobe's layout under ``out`` (``out/step0/proc0/``), so
    ``msprobe compare --target_path out/step0 --golden_path ...`` reads it; the
    ``dump.json`` folder. A tensor-mode dump carries its tensors (``.pt`` files)."""
    root = Path(out)
    if root.exists():
        raise PrecisionError(f"{root}: already exists: pass a new folder for the msprobe dump")
    proc = root / "step0" / "proc0"
    data_dir = proc / "dump_tensor_data"
    data_dir.mkdir(parents=True)
    records: dict[str, dict[str, Any]] = {}
    for e in dump.entries:
        if e.name == "<root>":
            continue  # msprobe does not record the top module
        key = f"Module.{e.name}.{e.cls or 'Module'}.forward.{e.call}"
        rec = records.setdefault(key, {"input_args": [], "input_kwargs": {}, "output": []})
        item: dict[str, Any] = {
            "type": "torch.Tensor",
            "dtype": f"torch.{e.dtype}",
            "shape": e.shape,
            "Max": e.stats.get("max"),
            "Min": e.stats.get("min"),
            "Mean": e.stats.get("mean"),
            "Norm": e.stats.get("norm"),
            "requires_grad": False,
        }
        if dump.has_tensors():
            name = f"{key}.{e.io}.{e.index}.pt"
            torch.save(dump.tensor(e).clone(), data_dir / name)
            item["data_name"] = name
        elif e.md5:
            item["md5"] = e.md5
        rec["input_args" if e.io == "input" else "output"].append(item)
    index = {
        "task": "tensor" if dump.has_tensors() else "statistics",
        "level": "L0",
        "framework": "pytorch",
        "dump_data_dir": str(data_dir.resolve()) if dump.has_tensors() else None,
        "data": records,
    }
    atomic_write_text(proc / "dump.json", json.dumps(index, indent=1))
    atomic_write_text(proc / "construct.json", json.dumps({k: None for k in records}, indent=1))
    atomic_write_text(proc / "stack.json", "{}")
    return proc
