"""How much of a rank's step is communication: one extra profiled step (never a timed
one) and the union of its collectives' spans, from torch.profiler (CPU: c10d ops; CUDA:
NCCL kernels) or torch_npu.profiler's trace_view.json (HCCL operators).

Asked to keep that step (``keep_in``: ``pypto-tune profile --nproc``), every rank leaves
its profile in one folder per arm, in the layout the field's cluster tools read: on NPU
torch_npu's own ``<host>_<pid>_<time>_ascend_pt`` folders side by side (what
msprof-analyze's cluster analysis takes as its input folder), elsewhere one Chrome trace
per rank, ``rank<R>.trace.json``, carrying torch's ``distributedInfo`` (rank, world size:
what per-rank trace tools such as Holistic Trace Analysis read).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "COLLECTIVE_PREFIXES",
    "GRAPH_COMM_UNMEASURED_CPU",
    "PROFILER_STEP",
    "RANK_TRACE_NAME",
    "communication",
    "hccl_spans",
    "union_of_spans",
]

#: Profiler events that are collectives called by the rank (c10d and functional c10d ops;
#: the backend's own worker-thread events such as ``gloo:all_reduce`` are not counted).
COLLECTIVE_PREFIXES = ("c10d::", "_c10d_functional::")
#: Why the graph arm's time in collectives is not measured on CPU (see
#: :func:`pypto_bench.multi.arms.measure_arm`).
GRAPH_COMM_UNMEASURED_CPU = (
    "not measured on CPU: torch.profiler over the compiled step with gloo collectives in "
    "flight can crash a rank (SIGSEGV in wait_tensor); measured on CUDA (NCCL kernels)"
)
#: The profiled step's range in a kept trace: the name torch's scheduled profiler gives a
#: step (``ProfilerStep#<n>``), which Holistic Trace Analysis requires.
PROFILER_STEP = "ProfilerStep#0"
#: A rank's kept Chrome trace in its arm's folder (CPU / CUDA), by global rank.
RANK_TRACE_NAME = "rank{rank}.trace.json"
#: torch_npu.profiler's trace_view.json: HCCL operators are spans named ``hcom_<op>_...``
#: on the communication rows (process named "HCCL" / "Communication").
_HCCL_PROCESSES = ("hccl", "communication")
#: Largest trace_view.json read back (one decode or prefill step is a few MB).
_MAX_TRACE_BYTES = 256 * 1024 * 1024


def communication(
    step: Callable[[], Any], device: Any, *, keep_in: Path | None = None
) -> dict[str, Any]:
    """Time inside collectives during one extra profiled step (never a timed one).

    CPU (gloo): the union of the rank's c10d / functional-c10d op intervals, i.e. the time
    the rank's thread spent inside collective calls. CUDA: the union of NCCL kernels on
    the device. Share = that time / the profiled step's wall time (profiler overhead
    included in both). ``keep_in``: the arm's folder where this rank's profile stays
    (``figures["profile"]`` names it, relative to the folder).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    from pypto_capture import synchronize

    if device.type == "npu":
        return _communication_npu(step, device, keep_in)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with torch.inference_mode(), profile(activities=activities) as prof:
        synchronize(device)
        start = time.perf_counter()
        # torch's own step mark (what a scheduled profiler's step() records): per-step
        # trace tools such as Holistic Trace Analysis find the step by it.
        with torch.profiler.record_function(PROFILER_STEP):
            step()
        synchronize(device)
        wall = time.perf_counter() - start
    spans = []
    by_op: dict[str, float] = {}
    for e in prof.events():
        name = str(e.name)
        if device.type == "cuda":
            on_device = "cuda" in str(getattr(e, "device_type", "")).lower()
            hit = on_device and "nccl" in name.lower()
        else:
            hit = name.startswith(COLLECTIVE_PREFIXES)
        if hit:
            a, b = float(e.time_range.start), float(e.time_range.end)
            spans.append((a, b))
            by_op[name] = by_op.get(name, 0.0) + (b - a) / 1e6
    figures = _comm_figures(
        spans,
        wall,
        "torch.profiler: NCCL kernels on the device (union)"
        if device.type == "cuda"
        else "torch.profiler: c10d / _c10d_functional ops on the rank (union)",
    )
    # Per op name (seconds, summed; spans may nest): where the time went, e.g. a
    # functional all-reduce vs the wait_tensor that blocks until the peers arrive.
    figures["by_op_s"] = dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:8])
    if keep_in is not None:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        name = RANK_TRACE_NAME.format(rank=rank)
        keep_in.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(keep_in / name))
        figures["profile"] = name
    return figures


def _comm_figures(spans: list[tuple[float, float]], wall: float, method: str) -> dict[str, Any]:
    """Time in collectives (the union of their spans, in us) against the step's wall time."""
    busy_us, calls = union_of_spans(spans)
    seconds = busy_us / 1e6
    return {
        "seconds": seconds,
        "step_seconds": wall,
        "share": seconds / wall if wall > 0 else None,
        "collective_spans": calls,
        "method": method,
    }


def _communication_npu(
    step: Callable[[], Any], device: Any, keep_in: Path | None
) -> dict[str, Any]:
    """HCCL time of one profiled step with torch_npu.profiler (it has no in-memory events:
    it writes an ``*_ascend_pt`` folder, whose trace_view.json is read back here). Kept:
    in ``keep_in`` beside the other ranks' folders, this rank's found by its host and pid
    (torch_npu names it ``<host>_<pid>_<time>_ascend_pt``)."""
    import socket

    import torch

    from pypto_capture import synchronize

    from ..environment import NPU

    with contextlib.ExitStack() as stack:
        if keep_in is None:
            out = stack.enter_context(tempfile.TemporaryDirectory(prefix="pypto-hccl-"))
            own = "*_ascend_pt"
        else:
            keep_in.mkdir(parents=True, exist_ok=True)
            out = str(keep_in)
            own = f"{glob.escape(socket.gethostname())}_{os.getpid()}_*_ascend_pt"
        handler = NPU.resolve("torch_npu.profiler.tensorboard_trace_handler")(dir_name=out)
        activity = "torch_npu.profiler.ProfilerActivity."
        prof = NPU.resolve("torch_npu.profiler.profile")(
            activities=[NPU.resolve(activity + "CPU"), NPU.resolve(activity + "NPU")],
            on_trace_ready=handler,
        )
        with torch.inference_mode(), prof:
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            wall = time.perf_counter() - start
        traces = sorted(Path(out).glob(f"{own}/ASCEND_PROFILER_OUTPUT/trace_view.json"))
        if not traces:
            return {
                "seconds": None, "step_seconds": wall, "share": None, "method": None,
                "unmeasured": "torch_npu.profiler wrote no trace_view.json (see ~/ascend/log)",
            }  # fmt: skip
        spans = hccl_spans(traces[-1])
    figures = _comm_figures(
        spans,
        wall,
        "torch_npu.profiler: hcom_* operators on the HCCL rows of trace_view.json (union)",
    )
    if keep_in is not None:
        figures["profile"] = traces[-1].parents[1].name
    return figures


def hccl_spans(trace_view: Path) -> list[tuple[float, float]]:
    """(start, end) in us of every HCCL operator span of a torch_npu trace_view.json.

    The file is the profiler's output on this machine, still read defensively: size
    bounded, non-numeric fields skipped, no recursion into its values.
    """
    if trace_view.stat().st_size > _MAX_TRACE_BYTES:
        raise ValueError(f"{trace_view} is over {_MAX_TRACE_BYTES >> 20} MiB")
    data = json.loads(trace_view.read_text(encoding="utf-8", errors="replace"))
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(events, list):
        return []
    rows = {
        e.get("pid")
        for e in events
        if isinstance(e, dict)
        and e.get("ph") == "M"
        and e.get("name") == "process_name"
        and isinstance(e.get("args"), dict)
        and any(k in str(e["args"].get("name", "")).lower() for k in _HCCL_PROCESSES)
    }
    spans = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or e.get("pid") not in rows:
            continue
        if not str(e.get("name", "")).lower().startswith("hcom"):
            continue
        try:
            start, dur = float(e["ts"]), float(e["dur"])
        except (KeyError, TypeError, ValueError):
            continue
        spans.append((start, start + dur))
    return spans


def union_of_spans(spans: list[tuple[float, float]]) -> tuple[float, int]:
    """(total length, number of separate stretches) of the union of ``(start, end)`` spans:
    nested or overlapping spans count once."""
    total = 0.0
    count = 0
    end = float("-inf")
    for a, b in sorted(spans):
        if a >= end:
            total += b - a
            count += 1
            end = b
        elif b > end:
            total += b - end
            end = b
    return total, count
