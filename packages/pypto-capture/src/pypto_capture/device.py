"""Device layer: one vocabulary for CPU, CUDA and Ascend NPU across torch 2.5-2.14.

torch grew a device-agnostic ``torch.accelerator`` namespace over several releases
(memory API in 2.9, ``Graph`` in 2.12). We use it where the installed torch has the
piece we need and fall back to ``torch.cuda`` / ``torch.npu`` otherwise, detected by
feature (hasattr), never by version string. torch_npu is imported only when installed;
nothing here requires it. Every torch.npu name is declared in :mod:`.npu_names` and
reached through it (checked against each torch_npu wheel by ``nox -s npu_api``); where a
keyword exists only in some torch_npu releases, the table's version bounds decide.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .errors import DeviceNotAvailableError, InvalidDeviceSpecError
from .npu_names import NPU, NpuModule

log = logging.getLogger(__name__)

__all__ = [
    "MemoryStats",
    "device_name",
    "empty_cache",
    "free_bytes",
    "graph_pool_handle",
    "memory_stats",
    "new_graph",
    "new_stream",
    "npu_available",
    "reset_peak_memory",
    "resolve_device",
    "stream_context",
    "synchronize",
]


def _import_torch_npu() -> Any | None:
    """torch_npu when it is installed and importable (it needs CANN), else None."""
    try:
        import torch_npu
    except Exception:  # ImportError, or CANN libraries missing: both mean "no NPU here"
        return None
    return torch_npu


def npu_available() -> bool:
    """True when torch_npu is importable and sees at least one NPU."""
    if _import_torch_npu() is None:
        return False
    npu = NpuModule()
    try:
        return bool(npu.is_available() and npu.device_count() > 0)
    except Exception:
        return False


def _cuda_available() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:
        return False


def resolve_device(spec: str | int | torch.device | None = "auto") -> torch.device:
    """Turn a user's device spec into a ``torch.device`` that exists here.

    ``"auto"``, ``None``, ``0`` or ``"0"`` pick the first NPU, else the first CUDA GPU,
    else the CPU; an integer or digit string picks that index on the same preference.
    Explicit ``"cpu"``, ``"cuda:N"``, ``"npu:N"`` are checked, so a typo or a missing
    device fails here with one line rather than deep inside a model load.
    """
    if isinstance(spec, torch.device):
        spec = str(spec)
    if spec is None:
        spec = "auto"
    if isinstance(spec, int) or (
        isinstance(spec, str) and spec.strip().isascii() and spec.strip().isdigit()
    ):
        index = int(spec)
        if npu_available():
            return _check_index("npu", index)
        if _cuda_available():
            return _check_index("cuda", index)
        if index == 0:
            return torch.device("cpu")
        raise DeviceNotAvailableError(
            f"device index {index} requested but no NPU or CUDA device is present; use 'cpu'"
        )
    text = str(spec).strip().lower()
    if text == "auto":
        if npu_available():
            return torch.device("npu", 0)
        if _cuda_available():
            return torch.device("cuda", 0)
        return torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    kind, _, idx = text.partition(":")
    if kind not in ("cuda", "npu") or (idx and not (idx.isascii() and idx.isdigit())):
        raise InvalidDeviceSpecError(
            f"unknown device {spec!r}; use 'auto', 'cpu', a card number, 'cuda:N' or 'npu:N'"
        )
    return _check_index(kind, int(idx) if idx else 0)


def _check_index(kind: str, index: int) -> torch.device:
    if kind == "npu":
        if not npu_available():
            raise DeviceNotAvailableError(
                f"npu:{index} requested but torch_npu with an Ascend NPU is not available here "
                "(install torch_npu matching torch and CANN, source CANN's set_env.sh); or use 'cpu'"
            )
        count = NpuModule().device_count()
    else:
        if not _cuda_available():
            raise DeviceNotAvailableError(
                f"cuda:{index} requested but no CUDA device is visible to torch "
                f"(torch {torch.__version__}); use a CUDA build of torch or 'cpu'"
            )
        count = torch.cuda.device_count()
    if index >= count:
        raise DeviceNotAvailableError(
            f"{kind}:{index} requested but only {count} {kind} device(s) exist; use {kind}:0..{count - 1}"
        )
    return torch.device(kind, index)


def _module(device: torch.device) -> Any | None:
    """torch.cuda / torch.npu for an accelerator device, None for CPU."""
    if device.type == "cuda":
        return torch.cuda
    if device.type == "npu":
        return NpuModule() if _import_torch_npu() is not None else None
    return None


def _accel() -> Any | None:
    acc = getattr(torch, "accelerator", None)
    if acc is None:
        return None
    try:
        return acc if acc.current_accelerator() is not None else None
    except Exception:
        return None


def _use_accelerator(device: torch.device, name: str) -> Any | None:
    """torch.accelerator when it has ``name`` and its accelerator is ``device``'s type."""
    acc = _accel()
    if acc is None or not hasattr(acc, name):
        return None
    try:
        if acc.current_accelerator().type != device.type:
            return None
    except Exception:
        return None
    return acc


def synchronize(device: torch.device | str) -> None:
    """Wait for all queued work on ``device``; a no-op on CPU (ops there are synchronous)."""
    device = torch.device(device)
    if device.type == "cpu":
        return
    acc = _use_accelerator(device, "synchronize")
    if acc is not None:
        acc.synchronize(device)
        return
    mod = _module(device)
    if mod is not None:
        mod.synchronize(device)


def empty_cache(device: torch.device | str) -> None:
    """Return cached allocator blocks to the device (no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cpu":
        return
    acc = _use_accelerator(device, "empty_cache")
    if acc is not None:
        acc.empty_cache()
        return
    mod = _module(device)
    if mod is not None:
        mod.empty_cache()


def free_bytes(device: torch.device | str) -> int | None:
    """Free memory of ``device`` in bytes; None when it cannot be told.

    Why: a static cache or a model is allocated in one go, so a size that cannot fit must
    be refused before the allocation (a CPU run past its memory is OOM-killed with no
    message, an accelerator's allocation fails mid-run). CPU: the kernel's MemAvailable
    (what can be handed out without swapping); CUDA / NPU: the allocator's free figure.
    """
    device = torch.device(device)
    try:
        if device.type == "cpu":
            with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
                for line in f.read(1 << 16).splitlines():
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
            return None
        mod = _module(device)
        if mod is None:
            return None
        return int(mod.mem_get_info(device)[0])
    except Exception:  # no /proc (not Linux), a device that is gone: unknown, not fatal
        return None


@dataclass(frozen=True)
class MemoryStats:
    """Allocator figures in bytes. All 0 on CPU, where torch keeps no such counters."""

    peak_allocated: int = 0
    peak_reserved: int = 0
    reserved: int = 0
    allocated: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


_INITIALISED: set[torch.device] = set()


def _index(device: torch.device, acc: Any) -> int:
    """An explicit device index, with the device's allocator initialised first.

    The caching allocators answer "Invalid device argument" to a stats call made before
    anything touched the device (seen on CUDA with torch 2.11 when a bench resets peaks
    right after resolving the device); a zero-size allocation initialises it lazily.
    """
    if device not in _INITIALISED:
        torch.empty(0, device=device)
        _INITIALISED.add(device)
    if device.index is not None:
        return device.index
    current = getattr(acc, "current_device_index", None) or getattr(acc, "current_device", None)
    return int(current()) if current is not None else 0


def reset_peak_memory(device: torch.device | str) -> None:
    """Reset peak counters so a measurement excludes e.g. model load (no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cpu":
        return
    acc = _use_accelerator(device, "reset_peak_memory_stats")
    if acc is not None:
        acc.reset_peak_memory_stats(_index(device, acc))
        return
    mod = _module(device)
    if mod is not None:
        mod.reset_peak_memory_stats(device)


def memory_stats(device: torch.device | str) -> MemoryStats:
    """Peak allocated/reserved since the last reset, and current reserved/allocated."""
    device = torch.device(device)
    if device.type == "cpu":
        return MemoryStats()
    acc = _use_accelerator(device, "max_memory_reserved")
    src = acc if acc is not None else _module(device)
    if src is None:
        return MemoryStats()
    idx = _index(device, src)
    return MemoryStats(
        peak_allocated=int(src.max_memory_allocated(idx)),
        peak_reserved=int(src.max_memory_reserved(idx)),
        reserved=int(src.memory_reserved(idx)),
        allocated=int(src.memory_allocated(idx)),
    )


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_name(device: torch.device | str) -> str:
    """Human name of the device: GPU/NPU product name, or the CPU model."""
    device = torch.device(device)
    mod = _module(device)
    if mod is None:
        return _cpu_name()
    try:
        return str(mod.get_device_name(device))
    except Exception:
        return str(device)


def new_stream(device: torch.device) -> Any:
    """A fresh non-default stream on ``device`` (graph capture must not use the default one)."""
    if device.type == "cpu":
        raise DeviceNotAvailableError("streams exist only on an accelerator; CPU has none")
    mod = _module(device)
    if device.type == "npu" and mod is not None:
        return mod.Stream(**NPU.kwargs("torch_npu.npu.Stream", device=device))
    if mod is not None and hasattr(mod, "Stream"):
        return mod.Stream(device=device)
    return torch.Stream(device=device)


@contextlib.contextmanager
def stream_context(stream: Any) -> Iterator[None]:
    """Make ``stream`` current for the block (works for cuda/npu/torch.Stream objects)."""
    dev = torch.device(stream.device) if hasattr(stream, "device") else None
    mod = _module(dev) if dev is not None else None
    if mod is not None and hasattr(mod, "stream"):
        with mod.stream(stream):
            yield
        return
    with stream:
        yield


def current_stream(device: torch.device) -> Any:
    mod = _module(device)
    if mod is not None:
        return mod.current_stream(device)
    acc = _use_accelerator(device, "current_stream")
    if acc is not None:
        return acc.current_stream(device)
    raise DeviceNotAvailableError(f"no stream API for {device}")


def _use_accelerator_graph(device: torch.device) -> bool:
    if os.environ.get("PYPTO_CAPTURE_LEGACY_GRAPH", "") == "1":
        return False
    return _use_accelerator(device, "Graph") is not None


def new_graph(device: torch.device, pool: Any | None = None) -> Any:
    """An empty device graph: ``torch.accelerator.Graph`` (torch >= 2.12) or the per-backend class.

    Set ``PYPTO_CAPTURE_LEGACY_GRAPH=1`` to force torch.cuda.CUDAGraph / torch.npu.NPUGraph.
    """
    if device.type == "cpu":
        raise DeviceNotAvailableError(
            "graph capture needs an NPU or CUDA device; on CPU use backend='compile'"
        )
    if _use_accelerator_graph(device):
        return torch.accelerator.Graph(pool=pool)
    if device.type == "cuda":
        return torch.cuda.CUDAGraph()
    mod = _module(device)
    if mod is None or not hasattr(mod, "NPUGraph"):
        raise DeviceNotAvailableError(
            "this torch_npu has no NPUGraph; upgrade torch_npu (>= 2.5.1)"
        )
    return mod.NPUGraph()


def graph_pool_handle(device: torch.device, graph: Any | None = None) -> Any:
    """A memory-pool id so several graphs share one pool (saves memory across captures)."""
    if _use_accelerator_graph(device):
        return graph.pool() if graph is not None else None
    mod = _module(device)
    if mod is None:
        return None
    return mod.graph_pool_handle()


@contextlib.contextmanager
def graph_capture(
    graph: Any, device: torch.device, stream: Any, pool: Any | None = None
) -> Iterator[None]:
    """Capture work issued in the block into ``graph`` on the side ``stream``."""
    if _use_accelerator_graph(device):
        # torch.accelerator.Graph captures on the *current* stream: enter the side stream first.
        with stream_context(stream):
            synchronize(device)
            graph.capture_begin()
            try:
                yield
            finally:
                graph.capture_end()
        return
    mod = _module(device)
    assert mod is not None
    kwargs: dict[str, Any] = {"pool": pool, "stream": stream}
    if device.type == "npu":
        kwargs = NPU.kwargs("torch_npu.npu.graph", **kwargs, **npu_graph_options())
    with mod.graph(graph, **kwargs):
        yield


AUTO_DISPATCH_ENV = "PYPTO_CAPTURE_NPU_AUTO_DISPATCH"


def npu_graph_options() -> dict[str, Any]:
    """Extra ``torch.npu.graph`` keywords the installed torch_npu accepts.

    ``PYPTO_CAPTURE_NPU_AUTO_DISPATCH=1`` asks for ``auto_dispatch_capture=True`` (what
    torch_npu's replay error suggests for ops that must be dispatched during capture).
    torch_npu 2.5.1 has no such keyword (2.5.1.post1 added it): there the request is
    logged and dropped rather than failing inside torch_npu with a TypeError.
    """
    if os.environ.get(AUTO_DISPATCH_ENV, "") != "1":
        return {}
    if not NPU.accepts("torch_npu.npu.graph", "auto_dispatch_capture"):
        log.warning(
            "%s=1 ignored: torch_npu %s has no torch.npu.graph(auto_dispatch_capture=); "
            "install torch_npu >= 2.5.1.post1 for it",
            AUTO_DISPATCH_ENV,
            NPU.version("torch_npu"),
        )
        return {}
    return {"auto_dispatch_capture": True}
