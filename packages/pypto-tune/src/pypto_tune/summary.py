"""From a raw trace to the per-step summary: attribution, steps, utilisation, call graph.

Every figure is *per step* (the mean over the profiled steps), so a profile of 3
iterations and one of 10 read the same. A decode step is one generated token: an eager
``generate`` step runs from one forward's start to the next (its host-side glue
included), a captured step is one replay. The prompt's forward is never a decode step.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from typing import Any

from .collect import ITERATION_MARKER, LAUNCH_PROBE, PREFILL_MARKER
from .records import STEP_MARKERS, OpEvent, OpStat, Profile, RawTrace, Span, block_of_module

__all__ = [
    "CAST_OPS",
    "HEAVY_OP_PATTERNS",
    "HOST_OVERHEAD_OPS",
    "MATMUL_OPS",
    "NPU_MATMUL_OPS",
    "SYNC_OPS",
    "attribute",
    "compiled_call_steps",
    "heavy_calls",
    "is_heavy",
    "matmul_dims",
    "op_time",
    "step_periods",
    "summarize",
]

#: Operators where the host waits for the device (reads a device value or synchronizes).
#: ``aten::item`` / ``is_nonzero`` are not listed: each calls ``_local_scalar_dense``,
#: which is, so one ``.item()`` counts once.
SYNC_OPS = (
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "aclrtSynchronizeStream",
    "aclrtSynchronizeDevice",
)
#: Ranges torch.compile records around a compiled call that are host work (guards,
#: wrappers), not computation: they count as host gaps.
HOST_OVERHEAD_OPS = (
    "TorchDynamo Cache Lookup",
    "Pregraph bytecode",
    "AOTDispatcher Runtime Wrapper Prologue",
    "AOTDispatcher Runtime Wrapper Epilogue",
)
#: Operators capture cannot fuse away (each stays one call in a compiled graph); the
#: rest (elementwise, views, reductions) fuse, and on CPU their time is mostly dispatch.
HEAVY_OP_PATTERNS = ("mm", "scaled_dot_product", "attention", "conv", "linear", "embedding")
#: Ascend kernel types of matmuls (kernel_details "Type"): inputs [.., M, K] and [.., K, N].
NPU_MATMUL_OPS = ("MatMul", "MatMulV2", "MatMulV3", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", *NPU_MATMUL_OPS)
CAST_OPS = ("aten::_to_copy",)
_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "c10::Half": 2,
    "half": 2,
    "float16": 2,
    "c10::BFloat16": 2,
    "bfloat16": 2,
    "long": 8,
    "long int": 8,
    "int": 4,
    "bool": 1,
    "signed char": 1,
    "unsigned char": 1,
    # Ascend kernel_details spellings
    "DT_BF16": 2,
    "BF16": 2,
    "DT_FLOAT16": 2,
    "FLOAT16": 2,
    "DT_FLOAT": 4,
    "FLOAT": 4,
    "INT64": 8,
    "DT_INT64": 8,
    "INT32": 4,
    "DT_INT32": 4,
    "INT8": 1,
    "DT_INT8": 1,
}
_STEP_NAMES = STEP_MARKERS


def attribute(trace: RawTrace) -> None:
    """Give every operator the innermost module scope containing its start (per thread).

    Kernels (thread -1) keep what the backend set (the NPU reader places them on their
    launching operator's module); others are matched by time containment, which is
    exact for the nested ranges ``ModuleScopes`` records.
    """
    by_thread: dict[int, list[Span]] = defaultdict(list)
    for span in trace.modules:
        by_thread[span.thread].append(span)
    for spans in by_thread.values():
        # Ties (ranges rebuilt around the same kernels) put the parent first.
        spans.sort(key=lambda s: (s.start_us, -s.end_us, s.name.count(".")))
    for thread, spans in by_thread.items():
        events = sorted(
            (e for e in trace.events if e.thread == thread and e.module is None),
            key=lambda e: e.start_us,
        )
        stack: list[Span] = []
        i = 0
        for ev in events:
            while i < len(spans) and spans[i].start_us <= ev.start_us:
                while stack and stack[-1].end_us <= spans[i].start_us:
                    stack.pop()
                stack.append(spans[i])
                i += 1
            while stack and stack[-1].end_us <= ev.start_us:
                stack.pop()
            # A popped-too-early parent can hide under a finished child: search down.
            for span in reversed(stack):
                if span.start_us <= ev.start_us < span.end_us:
                    ev.module = span.name
                    break


def step_periods(trace: RawTrace, regime: str) -> list[Span]:
    """The spans every per-step figure is taken over (see the module docstring)."""
    marks = sorted(trace.steps, key=lambda s: s.start_us)
    steps = [s for s in marks if s.name in _STEP_NAMES]
    if not steps:
        steps = [s for s in marks if s.name == ITERATION_MARKER]
    if regime != "decode" or not steps:
        return [Span(s.name, s.start_us, s.end_us, s.thread) for s in steps]
    # A decode step lasts until the next one starts, unless an iteration or a prefill
    # boundary lies between them (then it ends with its own forward).
    boundaries = sorted(s.start_us for s in marks if s.name in (ITERATION_MARKER, PREFILL_MARKER))
    periods: list[Span] = []
    for cur, nxt in zip(steps, [*steps[1:], None], strict=True):
        end = cur.end_us
        if nxt is not None:
            k = bisect.bisect_right(boundaries, cur.end_us)
            if k >= len(boundaries) or boundaries[k] >= nxt.start_us:
                end = nxt.start_us
        periods.append(Span(cur.name, cur.start_us, end, cur.thread))
    return periods


#: The range dynamo wraps each call of a compiled frame in (torch >= 2.3).
COMPILED_REGION = "Torch-Compiled Region"


def compiled_call_steps(trace: RawTrace) -> list[Span]:
    """Decode steps read off the compiled forward calls, for a run that marks none.

    Why: the hf-compile arm is transformers' own ``generate`` with a compiled forward;
    no step mark is recorded inside it, so every figure was per whole ``generate`` call
    and ``compare eager hf-compile`` said 0.01x where the bench measured 1.74x. Each
    top-level compiled region is one forward; they are steps only when every iteration
    holds the same number of them, at least two (a frame split by graph breaks, or a
    compiled prefill beside eager decode, gives no such count: then nothing is read).
    """
    regions = sorted(
        (e for e in trace.events if e.name.startswith(COMPILED_REGION) and e.kind != "kernel"),
        key=lambda e: e.start_us,
    )
    top: list[Any] = []
    for e in regions:
        if top and e.start_us < top[-1].start_us + top[-1].dur_us and e.thread == top[-1].thread:
            continue  # nested inside the previous region
        top.append(e)
    iterations = [s for s in trace.steps if s.name == ITERATION_MARKER]
    if not top or not iterations:
        return []
    counts = [sum(1 for e in top if it.start_us <= e.start_us < it.end_us) for it in iterations]
    if len(set(counts)) != 1 or counts[0] < 2:
        return []
    return [
        Span(STEP_MARKERS[0], e.start_us, e.start_us + e.dur_us, e.thread)
        for e in top
        if any(it.start_us <= e.start_us < it.end_us for it in iterations)
    ]


def _unit(regime: str, trace: RawTrace) -> str:
    """What one step is in this profile (compare refuses two different units)."""
    if regime == "decode":
        return "decode step (one token)"
    if any(s.name in STEP_MARKERS for s in trace.steps):
        return "one forward"
    return "one bench iteration"


def _union(intervals: list[tuple[float, float]]) -> float:
    total = 0.0
    last = float("-inf")
    for a, b in sorted(intervals):
        if b <= last:
            continue
        total += b - max(a, last)
        last = b
    return total


def _elem_bytes(dtype: Any) -> int:
    return _DTYPE_BYTES.get(str(dtype), 4)


def matmul_dims(name: str, shapes: list[Any] | None) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a matmul operator from its input shapes, or None (also when a
    dimension is not a positive integer: a shape read from a file proves nothing)."""
    if not shapes or not isinstance(shapes, list):
        return None
    try:
        if name == "aten::mm":
            (m, k), (_, n) = shapes[0], shapes[1]
            dims = (1, m, n, k)
        elif name == "aten::addmm":
            (m, k), (_, n) = shapes[1], shapes[2]
            dims = (1, m, n, k)
        elif name == "aten::bmm":
            (b, m, k), (_, _, n) = shapes[0], shapes[1]
            dims = (b, m, n, k)
        elif name == "aten::baddbmm":
            (b, m, k), (_, _, n) = shapes[1], shapes[2]
            dims = (b, m, n, k)
        elif name in NPU_MATMUL_OPS:
            a, w = list(shapes[0]), list(shapes[1])
            batch = 1
            for d in a[:-2]:
                batch *= d if type(d) is int else 0
            dims = (batch, a[-2], w[-1], a[-1])
        else:
            return None
    except (TypeError, ValueError, IndexError):
        return None
    if not all(type(d) is int and d > 0 for d in dims):
        return None
    return dims


def _op_bytes(ev: OpEvent) -> float | None:
    if not ev.shapes:
        return None
    dims = matmul_dims(ev.name, ev.shapes)
    elem = _elem_bytes((ev.dtypes or ["float"])[0] if ev.dtypes else "float")
    if dims is not None:
        b, m, n, k = dims
        return float(b * (m * k + k * n + m * n) * elem)
    total = 0
    for i, shape in enumerate(ev.shapes):
        if isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape):
            size = 1
            for d in shape:
                size *= d
            dt = ev.dtypes[i] if ev.dtypes and i < len(ev.dtypes) else "float"
            total += size * _elem_bytes(dt)
    return float(total) if total else None


def _op_flops(ev: OpEvent) -> float | None:
    dims = matmul_dims(ev.name, ev.shapes)
    if dims is not None:
        b, m, n, k = dims
        return 2.0 * b * m * n * k
    return ev.flops


def is_heavy(name: str) -> bool:
    """An operator a compiled graph still calls as itself (matmul, attention kernel)."""
    return name in MATMUL_OPS or name.startswith(
        ("aten::_scaled_dot_product", "aten::_flash_attention", "aten::_efficient_attention")
    )


def heavy_calls(ops: list[OpStat]) -> float:
    """Matmul and attention-kernel calls per step (the segments of a compiled step)."""
    return sum(o.calls for o in ops if is_heavy(o.name))


def op_time(op: OpStat, device_type: str) -> float:
    """The time an operator occupies the device per step (CPU: its own compute; the
    wrappers torch.compile records around a compiled call are host time, 0 here)."""
    if device_type == "cpu":
        return 0.0 if op.name in HOST_OVERHEAD_OPS or op.kind == "host" else op.self_us
    return op.device_us


def summarize(
    trace: RawTrace,
    *,
    regime: str = "decode",
    meta: dict[str, Any] | None = None,
    peaks: dict[str, Any] | None = None,
    classes: dict[str, str] | None = None,
    counters: dict[str, Any] | None = None,
    memory: dict[str, Any] | None = None,
) -> Profile:
    """Attribute, cut into steps and aggregate ``trace`` into a :class:`Profile`."""
    attribute(trace)
    warnings: list[str] = []
    if regime == "decode" and not any(s.name in _STEP_NAMES for s in trace.steps):
        calls = compiled_call_steps(trace)
        if calls:
            trace.steps.extend(calls)
            warnings.append(
                "the decode steps are the compiled forward calls (transformers' generate "
                "records no step marks): one call per generated token"
            )
    periods = step_periods(trace, regime)
    if not periods:
        warnings.append("no step was recorded: every figure is over the whole trace")
        if trace.events:
            start = min(e.start_us for e in trace.events)
            end = max(e.end_us for e in trace.events)
            periods = [Span("trace", start, end)]
    n = max(len(periods), 1)
    starts = [p.start_us for p in periods]
    device = trace.device_type

    def period_of(ev: OpEvent) -> int | None:
        # A device kernel runs after the host launched it, possibly after the host's step
        # ended: it belongs to the step that launched it where the backend knows when.
        at = float(ev.extra.get("launch_us", ev.start_us)) if ev.kind == "kernel" else ev.start_us
        k = bisect.bisect_right(starts, at) - 1
        if k < 0:
            return None
        p = periods[k]
        if at >= p.end_us:
            return None
        if ev.kind != "kernel" and p.thread and ev.thread != p.thread:
            return None
        return k

    per_step_busy: list[list[tuple[float, float]]] = [[] for _ in periods]
    busy_self = [0.0 for _ in periods]
    agg: dict[tuple[str, str | None], dict[str, Any]] = {}
    syncs = 0
    for ev in trace.events:
        k = period_of(ev)
        if k is None:
            continue
        p = periods[k]
        if device == "cpu" and ev.kind == "op" and ev.name not in HOST_OVERHEAD_OPS:
            # One CPU thread: operators' self times partition the time spent inside
            # operators, so their sum is the busy time (nesting counted once).
            busy_self[k] += ev.self_us if ev.self_us is not None else 0.0
        elif device != "cpu" and ev.kind == "kernel":
            # Kernels placed by their launch keep their own interval (it may run past the
            # host's step); time-placed ones are clipped to the step.
            if "launch_us" in ev.extra:
                per_step_busy[k].append((ev.start_us, ev.end_us))
            else:
                per_step_busy[k].append((max(ev.start_us, p.start_us), min(ev.end_us, p.end_us)))
        if ev.name in SYNC_OPS:
            syncs += 1
        if device != "cpu" and ev.kind == "kernel" and ev.module is None:
            continue  # CUDA kernels are counted through their launching operator
        key = (ev.name, ev.module)
        a = agg.setdefault(
            key,
            {
                "calls": 0,
                "host": 0.0,
                "self": 0.0,
                "device": 0.0,
                "shapes": Counter(),
                "dtypes": {},
                "flops": 0.0,
                "bytes": 0.0,
                "kind": ev.kind,
                "core": ev.core,
            },
        )
        # A kernel fused across modules is split into one event per module: each part
        # counts as its share of one call.
        a["calls"] += float(ev.extra.get("share", 1.0))
        a["host"] += ev.dur_us if ev.kind != "kernel" else 0.0
        a["self"] += ev.self_us if ev.self_us is not None else ev.dur_us
        a["device"] += ev.device_us or 0.0
        if ev.shapes:
            sk = repr(ev.shapes)
            a["shapes"][sk] += 1
            a["dtypes"][sk] = (ev.shapes, ev.dtypes)
        a["flops"] += _op_flops(ev) or 0.0
        a["bytes"] += _op_bytes(ev) or 0.0

    ops: list[OpStat] = []
    for (name, module), a in agg.items():
        block, layer = block_of_module(module, classes)
        shapes = dtypes = None
        if a["shapes"]:
            top_key = a["shapes"].most_common(1)[0][0]
            shapes, dtypes = a["dtypes"][top_key]
        ops.append(
            OpStat(
                name=name,
                module=module,
                block=block,
                layer=layer,
                calls=a["calls"] / n,
                host_us=a["host"] / n,
                self_us=a["self"] / n,
                device_us=a["device"] / n,
                kind=a["kind"],
                core=a["core"],
                shapes=shapes,
                dtypes=[str(d) for d in dtypes] if dtypes else None,
                flops=(a["flops"] / n) or None,
                bytes=(a["bytes"] / n) or None,
            )
        )
    ops.sort(key=lambda o: -op_time(o, device))

    probes = [s for s in trace.steps if s.name == LAUNCH_PROBE]
    probe_us = [
        e.self_us
        for e in trace.events
        if e.name == "aten::add"
        and e.self_us is not None
        and any(s.start_us <= e.start_us < s.end_us for s in probes)
    ]
    durations = [p.dur_us for p in periods]
    busy = busy_self if device == "cpu" else [_union(iv) for iv in per_step_busy]
    step_us = statistics.fmean(durations) if durations else 0.0
    busy_us = statistics.fmean(busy) if busy else 0.0
    gap_us = max(step_us - busy_us, 0.0)
    step = {
        "count": len(periods) if trace.steps else 0,
        "unit": _unit(regime, trace),
        "time_us": {
            "mean": step_us,
            "median": statistics.median(durations) if durations else 0.0,
            "min": min(durations) if durations else 0.0,
            "max": max(durations) if durations else 0.0,
            "stdev": statistics.stdev(durations) if len(durations) > 1 else 0.0,
            # Every profiled step's time: what `compare` forms its noise interval from.
            "samples": list(durations),
        },
        "device_busy_us": busy_us,
        "host_gap_us": gap_us,
        "utilisation": (busy_us / step_us) if step_us else None,
        "host_syncs": syncs / n,
        # An empty operator's recorded time under these profiler settings (None without
        # the probe): operators not much longer than this are launch cost.
        "launch_us": statistics.median(probe_us) if probe_us else None,
        "compiled_regions": sum(o.calls for o in ops if o.name.startswith("Torch-Compiled Region")),
        "critical_path": _critical_path(ops, device, step_us, busy_us, gap_us),
    }

    blocks: dict[str, dict[str, float]] = {}
    for op in ops:
        t = op_time(op, device)
        b = blocks.setdefault(op.block, {"us": 0.0, "share": 0.0})
        b["us"] += t
    blocks["host gaps"] = {"us": gap_us, "share": 0.0}
    for b in blocks.values():
        b["share"] = b["us"] / step_us if step_us else 0.0

    return Profile(
        meta=dict(meta or {}),
        peaks=dict(peaks or {}),
        step=step,
        ops=ops,
        blocks=blocks,
        call_graph=_call_graph(trace, periods, classes),
        counters=dict(counters or {}),
        memory=dict(memory or {}),
        warnings=warnings,
        trace=trace,
    )


def _critical_path(
    ops: list[OpStat], device: str, step_us: float, busy_us: float, gap_us: float
) -> dict[str, Any]:
    """What bounds the step: the host (device idle between operators) or the device,
    and the operators that hold the device longest on it."""
    top = [
        {"name": o.name, "module": o.module, "us": op_time(o, device)}
        for o in ops[:5]
        if op_time(o, device) > 0
    ]
    return {
        "bound": "host" if gap_us > busy_us else "device",
        "device_us": busy_us,
        "host_us": gap_us,
        "top_ops": top,
    }


def _call_graph(
    trace: RawTrace, periods: list[Span], classes: dict[str, str] | None
) -> list[dict[str, Any]]:
    """Module tree with inclusive time and calls per step (the operator call graph's
    upper levels; operators hang off it by their ``module``)."""
    n = max(len(periods), 1)
    starts = [p.start_us for p in periods]
    agg: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for span in trace.modules:
        k = bisect.bisect_right(starts, span.start_us) - 1
        if k < 0 or span.start_us >= periods[k].end_us:
            continue
        agg[span.name][0] += span.dur_us
        agg[span.name][1] += 1
    out = []
    for name, (us, calls) in sorted(agg.items()):
        block, layer = block_of_module(name, classes)
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        out.append(
            {
                "module": name,
                "class": (classes or {}).get(name),
                "parent": parent,
                "block": block,
                "layer": layer,
                "us": us / n,
                "calls": calls / n,
            }
        )
    return out
