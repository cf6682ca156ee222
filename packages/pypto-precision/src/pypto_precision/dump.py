"""Record every module's outputs (and optionally inputs) of one forward pass into a dump.

A dump is a folder: ``index.json`` (the format, the mode, what was run, and one entry per
recorded tensor in execution order) and, in tensor mode, safetensors shards. It is
self-contained, so a dump made on an NPU machine is compared on a laptop.

Why forward hooks on every named module: the entry names are the module names a user sees
in the modeling code (``model.layers.3.mlp``), and outputs arrive in execution order
(children before their parent), which is what "the first module that diverges" needs. A
module called more than once (a shared block, one call per decode step) gets one entry per
call (``call`` 0, 1, ...). Hooks do not fire inside a captured graph: dump the eager run of
the same arm's code, compare the graph arm at the logits (pypto_precision.logits).

The dump is written to a hidden sibling folder and renamed into place when the pass ends;
a pass that fails (an error, a ``--max-bytes`` refusal) leaves nothing behind.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from pypto_common import atomic_write_text

from .errors import DumpTooLargeError, PrecisionError
from .stats import dtype_name, md5_of, tensor_stats

__all__ = [
    "DEFAULT_MAX_BYTES",
    "FORMAT",
    "INDEX",
    "MODES",
    "VERSION",
    "Entry",
    "Recorder",
    "flatten_tensors",
]

log = logging.getLogger(__name__)

FORMAT = "pypto-precision-dump"
VERSION = 1
INDEX = "index.json"
MODES = ("statistics", "tensor", "md5")
#: Tensor mode refuses past this many bytes of tensors unless told otherwise (--max-bytes).
DEFAULT_MAX_BYTES = 4 << 30
# A shard is written once it holds this many bytes (keeps the host copy bounded).
_SHARD_BYTES = 256 << 20
# At most this many tensors are taken from one call's inputs or outputs (a cache object
# with hundreds of layers is not what a compare needs).
_MAX_TENSORS_PER_CALL = 64


@dataclass
class Entry:
    """One recorded tensor: ``(name, call, io, index)`` identifies it across two dumps."""

    name: str
    call: int
    io: str
    index: int
    order: int
    shape: list[int]
    dtype: str
    stats: dict[str, Any]
    md5: str | None = None
    file: str | None = None
    key: str | None = None
    cls: str | None = None

    @property
    def id(self) -> str:
        return f"{self.name}.{self.call}.{self.io}.{self.index}"

    @property
    def module(self) -> str:
        """The module and call, e.g. ``model.layers.3.mlp#0``."""
        return f"{self.name}#{self.call}"


def flatten_tensors(value: Any, limit: int = _MAX_TENSORS_PER_CALL) -> list[torch.Tensor]:
    """The tensors inside a module's inputs or outputs (tuples, lists, dicts and
    transformers' ``ModelOutput`` walked in order), at most ``limit`` of them."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()

    def walk(v: Any, depth: int) -> None:
        if len(found) >= limit or depth > 6 or id(v) in seen:
            return
        if isinstance(v, torch.Tensor):
            found.append(v)
            return
        seen.add(id(v))
        if isinstance(v, dict):
            for item in list(v.values()):
                walk(item, depth + 1)
        elif isinstance(v, (tuple, list)):
            for item in v:
                walk(item, depth + 1)

    walk(value, 0)
    return found


@dataclass
class _State:
    entries: list[Entry] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    shard: dict[str, torch.Tensor] = field(default_factory=dict)
    shard_bytes: int = 0
    shards: int = 0
    total_bytes: int = 0


class Recorder:
    """Context manager: hooks every named module of ``model`` and writes the dump on exit.

    ``mode``: ``statistics`` (shape, dtype, statistics and a checksum: small enough for a
    30B model), ``md5`` (statistics plus the MD5 of each tensor's bytes) or ``tensor``
    (statistics plus the tensors themselves, in safetensors shards, refused past
    ``max_bytes``). ``meta`` is stored as given (the model fingerprint, the arm, the input
    token ids: what makes two dumps comparable). ``folder`` must not exist.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        folder: str | os.PathLike[str],
        *,
        mode: str = "statistics",
        with_inputs: bool = False,
        max_bytes: int = DEFAULT_MAX_BYTES,
        meta: dict[str, Any] | None = None,
    ) -> None:
        if mode not in MODES:
            raise PrecisionError(f"unknown dump mode {mode!r}: use one of {', '.join(MODES)}")
        if max_bytes <= 0:
            raise PrecisionError(f"--max-bytes must be positive, not {max_bytes}")
        self.model = model
        self.folder = Path(folder)
        self.mode = mode
        self.with_inputs = with_inputs
        self.max_bytes = max_bytes
        self.meta = dict(meta or {})
        self._state = _State()
        self._handles: list[Any] = []
        self._partial: Path | None = None
        self._classes: dict[str, str] = {}

    # -- context ---------------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        if self.folder.exists() or self.folder.is_symlink():
            raise PrecisionError(f"{self.folder}: already exists: pass a new folder for the dump")
        parent = self.folder.parent
        parent.mkdir(parents=True, exist_ok=True)
        self._partial = parent / f".{self.folder.name}.partial-{os.getpid()}"
        shutil.rmtree(self._partial, ignore_errors=True)
        self._partial.mkdir()
        names = {m: n for n, m in self.model.named_modules()}
        self._classes = {n: type(m).__name__ for m, n in names.items()}
        for module, name in names.items():
            if self.with_inputs:
                self._handles.append(
                    module.register_forward_pre_hook(self._pre_hook(name), with_kwargs=True)
                )
            self._handles.append(
                module.register_forward_hook(self._post_hook(name), with_kwargs=True)
            )
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        assert self._partial is not None
        try:
            if exc_type is None:
                self._finish()
                self._partial.rename(self.folder)
        finally:
            if self._partial.exists():
                shutil.rmtree(self._partial, ignore_errors=True)

    @property
    def entries(self) -> list[Entry]:
        return list(self._state.entries)

    # -- hooks -----------------------------------------------------------------------------
    def _pre_hook(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            call = self._state.calls.get(name, 0)
            self._record(name, call, "input", flatten_tensors((args, kwargs)))

        return hook

    def _post_hook(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            call = self._state.calls.get(name, 0)
            self._state.calls[name] = call + 1
            self._record(name, call, "output", flatten_tensors(output))

        return hook

    def _record(self, name: str, call: int, io: str, tensors: list[torch.Tensor]) -> None:
        st = self._state
        for index, t in enumerate(tensors):
            entry = Entry(
                name=name or "<root>",
                call=call,
                io=io,
                index=index,
                order=len(st.entries),
                shape=list(t.shape),
                dtype=dtype_name(t.dtype),
                stats=tensor_stats(t),
                cls=self._classes.get(name),
            )
            if self.mode == "md5":
                entry.md5 = md5_of(t)
            elif self.mode == "tensor":
                self._keep(entry, t)
            st.entries.append(entry)

    def _keep(self, entry: Entry, t: torch.Tensor) -> None:
        st = self._state
        size = t.numel() * t.element_size()
        if st.total_bytes + size > self.max_bytes:
            raise DumpTooLargeError(
                f"the tensor dump would pass --max-bytes {self.max_bytes} at {entry.id} "
                f"({st.total_bytes + size} bytes): raise --max-bytes, dump fewer tokens, or "
                "use --mode statistics"
            )
        st.total_bytes += size
        entry.key = f"e{entry.order:09d}"
        entry.file = _shard_name(st.shards + 1)
        st.shard[entry.key] = t.detach().to("cpu", copy=True).contiguous()
        st.shard_bytes += size
        if st.shard_bytes >= _SHARD_BYTES:
            self._flush()

    def _flush(self) -> None:
        from safetensors.torch import save_file

        st = self._state
        if not st.shard:
            return
        assert self._partial is not None
        st.shards += 1
        save_file(st.shard, str(self._partial / _shard_name(st.shards)))
        st.shard, st.shard_bytes = {}, 0

    def _finish(self) -> None:
        self._flush()
        assert self._partial is not None
        first = next(iter(self.model.parameters()), None)
        meta = {
            "device": str(first.device) if first is not None else None,
            "dtype": dtype_name(first.dtype) if first is not None else None,
            **self.meta,
            "versions": {
                "torch": torch.__version__,
                "python": platform.python_version(),
                **self.meta.get("versions", {}),
            },
        }
        index = {
            "format": FORMAT,
            "version": VERSION,
            "mode": self.mode,
            "with_inputs": self.with_inputs,
            "meta": meta,
            "entries": [asdict(e) for e in self._state.entries],
        }
        atomic_write_text(self._partial / INDEX, json.dumps(index, allow_nan=False))
        log.info("dump: %d entries (%s mode)", len(self._state.entries), self.mode)


def _shard_name(n: int) -> str:
    return f"tensors-{n:05d}.safetensors"
