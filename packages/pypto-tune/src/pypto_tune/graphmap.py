"""See inside a captured step: the graph arm's kernels attributed to the modules that
produced them.

A replayed graph shows up in a profile as kernels with generated names (or one opaque
replay), so a graph-arm profile used to report one ``captured`` block. Two sources give
each kernel its modules, and one matcher carries them onto the profile:

- **compile** (CPU and CUDA, and the compile stage of ``fused``): the provenance
  :mod:`pypto_capture.provenance` records while the step compiles (inductor's kernel ->
  FX nodes -> ``nn_module_stack``), one :class:`~pypto_capture.provenance.GraphProvenance`
  per compiled graph, kernels in call order;
- **replay** (a CUDA / NPU graph of a step): a *reference*, the kernel sequence one
  profiled run of the same step launched, each kernel with the module of the operator
  that launched it (:func:`reference_from_trace`).

:func:`attribute_captured` walks the profile's kernels in time order and matches them,
call by call, to a reference: one call of a graph is its whole kernel sequence, the same
names in the same order. Each matched kernel gets its module (a kernel fused across
modules is split by :data:`pypto_capture.provenance.SPLIT_RULE` and marked
``fused_across``), and module ranges are rebuilt around the matched kernels so the call
graph and the Chrome trace nest them. When the sequences do not match, nothing is
attributed and the report says why: the step stays one ``captured`` block rather than a
guessed breakdown.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from pypto_capture.provenance import SPLIT_RULE, GraphProvenance, profiler_key

from .records import ROOT_SCOPE, OpEvent, RawTrace, Span

__all__ = [
    "REGION_NAMES",
    "Reference",
    "attribute_captured",
    "mark_graph_wrappers",
    "reference_from_provenance",
    "reference_from_trace",
    "resolve_module_paths",
]

log = logging.getLogger(__name__)

#: Ranges torch.compile opens around one call of a compiled graph (its kernels run inside).
REGION_NAMES = ("## Call CompiledFxGraph", "CompiledFunction", "Torch-Compiled Region")


@dataclass(frozen=True)
class Reference:
    """One graph's kernel sequence: ``(profiler key, ((module, share), ...))`` per kernel,
    in call order; ``source`` says where it came from (``compile`` or ``replay``)."""

    kernels: tuple[tuple[str, tuple[tuple[str, float], ...]], ...]
    source: str
    classes: tuple[tuple[str, str], ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.kernels)


def resolve_module_paths(paths: dict[str, str], model: Any) -> dict[str, str]:
    """Map paths below the compiled function's root (``model.model.layers.0``: the
    runner's ``model`` attribute first) onto ``model.named_modules()`` names.

    The shortest suffix of a path that names a module of ``model`` with the same class
    wins; a path that names none maps to the model's own scope (``<model>``).
    """
    names = {name: type(m).__name__ for name, m in model.named_modules()} if model else {}
    root_cls = type(model).__name__ if model is not None else ""
    out: dict[str, str] = {}
    for path, cls in paths.items():
        parts = [p for p in path.split(".") if p]
        got = ROOT_SCOPE
        for k in range(len(parts) + 1):
            tail = ".".join(parts[k:])
            if tail and names.get(tail) == cls:
                got = tail
                break
            if not tail and cls == root_cls:
                got = ROOT_SCOPE
        out[path] = got
    return out


def reference_from_provenance(graph: GraphProvenance, model: Any) -> Reference:
    """A :class:`Reference` from one compiled graph's recorded provenance."""
    paths = dict(graph.classes)
    resolved = resolve_module_paths(paths, model)
    kernels = []
    for k in graph.kernels:
        shares: dict[str, float] = {}
        for path, share in k.modules:
            name = resolved.get(path, ROOT_SCOPE) if path else ROOT_SCOPE
            shares[name] = shares.get(name, 0.0) + share
        kernels.append((k.key, tuple(shares.items())))
    classes = {
        resolved[p]: c for p, c in paths.items() if resolved.get(p) not in (None, ROOT_SCOPE)
    }
    return Reference(tuple(kernels), "compile", tuple(sorted(classes.items())))


def reference_from_trace(trace: RawTrace, *, kinds: tuple[str, ...] = ("kernel",)) -> Reference:
    """A :class:`Reference` from a profiled run of the step (not replayed): its kernels
    in device order, each with the module its launching operator ran in (CUDA: the
    kernels each operator lists; NPU: kernels linked to their operator by the profiler's
    flows). Kernels the profiler could not link to an operator keep the model's scope."""
    launched = sorted(
        (e for e in trace.events if e.kind == "op" and e.extra.get("kernels")),
        key=lambda e: e.start_us,
    )
    if launched:
        # torch.profiler on CUDA: each operator lists the kernels it launched, in order
        # (one stream: the order the device runs them).
        return Reference(
            tuple(
                (profiler_key(str(k)), ((e.module or ROOT_SCOPE, 1.0),))
                for e in launched
                for k in e.extra["kernels"]
            ),
            "replay",
        )
    # Device order (the stream's), as a replay's kernels are read.
    evs = sorted((e for e in trace.events if e.kind in kinds), key=lambda e: e.start_us)
    return Reference(
        tuple((profiler_key(e.name), ((e.module or ROOT_SCOPE, 1.0),)) for e in evs), "replay"
    )


def _region_spans(trace: RawTrace) -> list[tuple[float, float, int]]:
    return sorted(
        (e.start_us, e.end_us, e.thread)
        for e in trace.events
        if e.kind in ("op", "host") and e.name.startswith(REGION_NAMES)
    )


def mark_graph_wrappers(trace: RawTrace) -> int:
    """Mark each compiled-graph call's own range as host time (``kind="host"``); how many.

    Only for a step compiled with a profiler range around every kernel (what recording
    provenance turns on): then a call's self time is its Python wrapper between kernels
    (allocations, size checks), host work like a launch. Without kernel ranges the same
    self time holds the generated kernels' computation and must stay.
    """
    n = 0
    for ev in trace.events:
        if ev.kind == "op" and ev.name.startswith(REGION_NAMES):
            ev.kind = "host"
            n += 1
    return n


def _candidates(trace: RawTrace, keys: set[str], source: str) -> list[OpEvent]:
    """The events a reference can match, in time order: on the host, operators that
    start inside a compiled-graph call (not the call's own ranges, not an operator nested
    in another candidate); for a replay, the device kernels."""
    if source == "replay":
        return sorted(
            (e for e in trace.events if e.kind == "kernel" and profiler_key(e.name) in keys),
            key=lambda e: e.start_us,
        )
    regions = _region_spans(trace)
    out: list[OpEvent] = []
    last_end: dict[int, float] = {}
    for ev in sorted(trace.events, key=lambda e: (e.start_us, -e.dur_us)):
        if ev.kind != "op" or ev.name.startswith(REGION_NAMES):
            continue
        if profiler_key(ev.name) not in keys:
            continue
        if not any(a <= ev.start_us < b and t == ev.thread for a, b, t in regions):
            continue
        if ev.start_us < last_end.get(ev.thread, float("-inf")):
            continue  # called from inside a kernel already matched
        out.append(ev)
        last_end[ev.thread] = ev.end_us
    return out


def _match(
    events: list[OpEvent], refs: list[Reference]
) -> tuple[list[tuple[OpEvent, tuple[tuple[str, float], ...]]], int, str | None]:
    """Events -> modules, call by call; (pairs, calls matched, why not) - all or nothing."""
    pairs: list[tuple[OpEvent, tuple[tuple[str, float], ...]]] = []
    calls = 0
    i = 0
    while i < len(events):
        key = profiler_key(events[i].name)
        window = [profiler_key(e.name) for e in events[i : i + max(len(r.kernels) for r in refs)]]
        ref = next((r for r in refs if tuple(window[: len(r.kernels)]) == r.keys), None)
        if ref is None:
            starts = [r for r in refs if r.keys and r.keys[0] == key]
            if not starts:
                return (
                    [],
                    calls,
                    (
                        f"kernel #{i + 1} of the profile ({events[i].name}) does not start any "
                        "recorded graph's kernel sequence"
                    ),
                )
            r = starts[0]
            seen = window[: len(r.kernels)]
            at = next(
                (j for j, (a, b) in enumerate(zip(seen, r.keys, strict=False)) if a != b), len(seen)
            )
            got = seen[at] if at < len(seen) else "the end of the profile"
            return (
                [],
                calls,
                (
                    f"call {calls + 1} of the graph differs from the recorded sequence at kernel "
                    f"{at + 1} of {len(r.keys)}: expected {r.keys[at]}, found {got}"
                ),
            )
        for ev, (_, modules) in zip(events[i : i + len(ref.kernels)], ref.kernels, strict=True):
            pairs.append((ev, modules))
        i += len(ref.kernels)
        calls += 1
    if not calls:
        return [], 0, "no kernel of a recorded graph ran in the profiled steps"
    return pairs, calls, None


def _common(paths: list[str]) -> str:
    if not paths or ROOT_SCOPE in paths:
        return ROOT_SCOPE
    parts = [p.split(".") for p in paths]
    out: list[str] = []
    for group in zip(*parts, strict=False):
        if len(set(group)) != 1:
            break
        out.append(group[0])
    return ".".join(out) or ROOT_SCOPE


def _spans(pairs: list[tuple[OpEvent, str]]) -> list[Span]:
    """Module ranges around consecutive kernels of one module (and of each ancestor)."""
    spans: list[Span] = []
    open_: dict[str, list[float]] = {}
    thread: dict[str, int] = {}
    for ev, module in sorted(pairs, key=lambda p: p[0].start_us):
        chain = [] if module == ROOT_SCOPE else module.split(".")
        want = {".".join(chain[: d + 1]) for d in range(len(chain))}
        for name in [n for n in open_ if n not in want]:
            a, b = open_.pop(name)
            spans.append(Span(name, a, b, thread[name]))
        for name in want:
            if name in open_:
                open_[name][1] = max(open_[name][1], ev.end_us)
            else:
                open_[name] = [ev.start_us, ev.end_us]
                thread[name] = ev.thread
    for name, (a, b) in open_.items():
        spans.append(Span(name, a, b, thread[name]))
    return spans


def attribute_captured(
    trace: RawTrace, refs: list[Reference], *, classes: dict[str, str] | None = None
) -> dict[str, Any]:
    """Attribute ``trace``'s captured kernels from ``refs`` (in place); the report.

    On success every matched event has its ``module``; one fused across modules is split
    into one event per module (``extra``: ``share``, ``fused_across``), times scaled by
    the share, so every total is kept. Module ranges are added to ``trace.modules``.
    The report (``meta["attribution"]`` of the profile) says what was matched, or why
    nothing was (``status`` ``fallback``).
    """
    report: dict[str, Any] = {
        "status": "fallback",
        "source": refs[0].source if refs else None,
        "graphs": len(refs),
        "kernels_per_call": [len(r.kernels) for r in refs],
        "split_rule": SPLIT_RULE,
    }
    refs = [r for r in refs if r.kernels]
    if not refs:
        report["why"] = "no kernel sequence was recorded for the captured step"
        return report
    keys = {k for r in refs for k in r.keys}
    sources = {r.source for r in refs}
    events = _candidates(trace, keys, "replay" if sources == {"replay"} else "compile")
    pairs, calls, why = _match(events, refs)
    report["calls"] = calls
    if why is not None:
        report["why"] = why
        log.warning("captured step not attributed: %s", why)
        return report
    split: list[OpEvent] = []
    placed: list[tuple[OpEvent, str]] = []
    fused = 0
    for ev, modules in pairs:
        if len(modules) == 1:
            ev.module = modules[0][0]
            placed.append((ev, ev.module))
            continue
        fused += 1
        names = [m for m, _ in modules]
        placed.append((ev, _common(names)))
        ev.extra["fused_across"] = names
        dur, own, dev = ev.dur_us, ev.self_us, ev.device_us
        for n, (module, share) in enumerate(modules):
            # The first part is the event itself, the others copies: times scaled by the
            # module's share, so the kernel's totals are kept.
            part = ev if n == 0 else dataclasses.replace(ev, extra=dict(ev.extra))
            part.module = module
            part.dur_us = dur * share
            part.self_us = own * share if own is not None else None
            part.device_us = dev * share if dev is not None else None
            part.extra["share"] = share
            if n:
                split.append(part)
    trace.events.extend(split)
    trace.modules.extend(_spans(placed))
    if classes is not None:
        for r in refs:
            for name, cls in r.classes:
                classes.setdefault(name, cls)
    report.update(
        {
            "status": "ok",
            "why": None,
            "kernels_matched": len(pairs),
            "fused_across": fused,
        }
    )
    return report
