"""Profile the step pypto-bench measures, on the bench's own model, inputs and arms.

The iteration comes from ``pypto_bench.open_session``: the same loading, prompt, MoE
routing, kernel plug-ins and captured step as a ``pypto-bench run`` (no second harness
that could drift from it). Warmup iterations (where torch.compile compiles) run before
the profiler starts; peaks (matmul throughput and read bandwidth) are measured on the
same device in the same process, right after the profiled iterations.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import time
from collections.abc import Callable
from typing import Any

from .collect import (
    ITERATION_MARKER,
    LEVELS,
    ModuleScopes,
    is_stack_failure,
    launch_probe,
)
from .collect import profile as raw_profile
from .errors import (
    BadInputError,
    ProfileFailedError,
    TuneError,
    from_bench_error,
)
from .records import Profile, RawTrace
from .summary import summarize

__all__ = [
    "ProgressFn",
    "counter_delta",
    "dynamo_counters",
    "graph_attribution",
    "kernel_plugins_for",
    "measure_launch_overhead",
    "measure_peaks",
    "measure_replay_overhead",
    "memory_sample",
    "profile",
    "profile_model",
    "profile_step",
    "replay_reference",
]

log = logging.getLogger(__name__)

ProgressFn = Callable[[str], None]


def dynamo_counters() -> dict[str, Any]:
    """A snapshot of torch.compile's counters (graph breaks, graphs compiled, frames)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # torch without dynamo: nothing to count
        return {}
    return {k: dict(v) for k, v in counters.items()}


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What torch.compile did between two snapshots: breaks by reason, new graphs, frames."""
    breaks: dict[str, int] = {}
    for reason, n in after.get("graph_break", {}).items():
        d = n - before.get("graph_break", {}).get(reason, 0)
        if d > 0:
            # The first line is the kind ("Failed to trace builtin operator"), the second
            # names the culprit ("... operator `print` ..."): keep both.
            lines = [ln.strip() for ln in str(reason).strip().splitlines()[:2]]
            breaks[" ".join(lines)[:300]] = d
    stats_a, stats_b = after.get("stats", {}), before.get("stats", {})
    frames_a, frames_b = after.get("frames", {}), before.get("frames", {})
    return {
        "graph_breaks": breaks,
        "graph_break_count": sum(breaks.values()),
        "graphs_compiled": stats_a.get("unique_graphs", 0) - stats_b.get("unique_graphs", 0),
        "frames_traced": frames_a.get("total", 0) - frames_b.get("total", 0),
    }


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def memory_sample(device: Any) -> tuple[str, int | None]:
    """(kind, bytes): the allocator's reserved bytes on an accelerator, RSS on CPU."""
    if getattr(device, "type", str(device)) == "cpu":
        return "process resident set (RSS)", _rss_bytes()
    from pypto_capture import memory_stats

    return "allocator reserved", int(memory_stats(device).reserved)


def measure_launch_overhead(device: Any, *, repeats: int = 2000) -> float:
    """Median host time of one tiny operator call (us): the price of an operator that does
    no work. Below a few of these an operator's time is launch, not computation."""
    import statistics

    import torch

    from pypto_capture import synchronize

    a = torch.ones(1, device=device)
    out = torch.empty_like(a)
    times = []
    with torch.inference_mode():
        for _ in range(20):
            torch.add(a, a, out=out)
        synchronize(device)
        for _ in range(repeats):
            t = time.perf_counter()
            torch.add(a, a, out=out)
            times.append(time.perf_counter() - t)
        synchronize(device)
    return statistics.median(times) * 1e6


def measure_replay_overhead(
    device: Any, *, tensors: int = 1, segments: int = 1, repeats: int = 50
) -> dict[str, Any]:
    """Median replay time of a small captured step shaped like the model's: ``segments``
    tiny matmuls each followed by fusible elementwise work (a compiled graph calls the
    matmul and one fused kernel per segment) and ``tensors`` inputs (a compiled step
    checks a guard per input tensor). On the device's default graph backend (compile on
    CPU, CUDA/NPU graphs on accelerators). It does almost no arithmetic, so its time is
    what a captured step of this structure costs besides its matmuls' work."""
    import statistics

    import torch

    from pypto_capture import make_backend, synchronize

    segments = max(1, min(int(segments), 4096))
    extra = max(0, min(int(tensors) - segments, 8192))
    weights = [torch.randn(8, 8, device=device) for _ in range(segments)]
    inputs = [torch.zeros(4, device=device) for _ in range(extra)]
    x = torch.randn(1, 8, device=device)
    out = torch.empty(1, 8, device=device)

    def step() -> Any:
        h = x
        for w in weights:
            h = torch.nn.functional.silu(h @ w) * 0.5 + h
        acc = h.sum()
        for t in inputs:
            acc = acc + t[0]
        return out.copy_(h + acc)

    backend = make_backend("auto", device)
    with torch.inference_mode():
        captured = backend.capture(step, warmup=1)
        times = []
        for _ in range(repeats):
            synchronize(device)
            t = time.perf_counter()
            captured.replay()
            synchronize(device)
            times.append(time.perf_counter() - t)
    return {
        "us": statistics.median(times) * 1e6,
        "backend": backend.name,
        "segments": segments,
        "tensors": extra + segments,
    }


def measure_peaks(device: Any, dtype: Any) -> dict[str, Any]:
    """Matmul FLOP/s for the model's dtype and read bandwidth, measured now (the bench's probes)."""
    from pypto_bench import measure_bandwidth, measure_matmul_peak

    mm = measure_matmul_peak(device, dtype)
    bw = measure_bandwidth(device)
    return {
        "op_launch_us": measure_launch_overhead(device),
        "matmul_flops_per_s": mm["flops_per_s"],
        "matmul_method": mm["method"],
        "bandwidth_bytes_per_s": bw["bytes_per_s"],
        "bandwidth_method": bw["method"],
    }


def _validate(level: str, iters: int, warmup: int) -> None:
    if level not in LEVELS:
        raise BadInputError(f"unknown level {level!r}: choose light or detail")
    if iters < 1 or warmup < 0:
        raise BadInputError(f"--iters must be >= 1 and --warmup >= 0 (got {iters}, {warmup})")


def profile_step(
    step: Callable[[], Any],
    *,
    device: Any = "cpu",
    level: str = "light",
    iters: int = 3,
    warmup: int = 1,
    model: Any = None,
    regime: str = "decode",
    peaks: bool = True,
    dtype: Any = None,
    kv_shapes: dict[str, int] | None = None,
    replay_probe: bool = False,
    meta: dict[str, Any] | None = None,
    output_dir: str | None = None,
    progress: ProgressFn | None = None,
    attribution: Callable[[RawTrace], tuple[dict[str, str], dict[str, Any]]] | None = None,
) -> Profile:
    """Profile any step function: warm it up, profile ``iters`` calls, measure peaks.

    With ``model`` (an ``nn.Module`` the step runs eagerly), every operator is attributed
    to the module that ran it and each root forward is a step (a forward over more than
    one position is the prompt's and not a decode step). Without it, each call of
    ``step`` is one step unless the step marks its own (a captured decode loop does).
    ``kv_shapes`` (batch, heads, kv_heads, head_dim, context) lets the KV-layout
    detector confirm a suspect layout with a microbenchmark at those shapes.
    ``attribution`` (a captured step's: :func:`graph_attribution`) gives the step's
    kernels their modules before the summary; its report is ``meta["attribution"]``.
    """
    import torch

    _validate(level, iters, warmup)
    say = progress or (lambda _m: None)
    dev = torch.device(device)
    started = time.time()
    stacks_dropped: str | None = None

    def profiled(with_stack: bool | None) -> tuple[Any, Any, str, list[int | None]]:
        scopes = (
            ModuleScopes(model, prefill_marks=regime == "decode") if model is not None else None
        )
        kind = ""
        values: list[int | None] = []
        try:
            if scopes is not None:
                scopes.attach()
            with raw_profile(
                level=level, device=dev, output_dir=output_dir, with_stack=with_stack
            ) as got:
                for i in range(iters):
                    say(f"profiled iteration {i + 1}/{iters}")
                    with torch.profiler.record_function(ITERATION_MARKER):
                        step()
                    kind, value = memory_sample(dev)
                    values.append(value)
                launch_probe(dev)
        finally:
            if scopes is not None:
                scopes.detach()
        return got, scopes, kind, values

    try:
        first = dynamo_counters()
        for i in range(warmup):
            say(f"warmup {i + 1}/{warmup}")
            step()
        before = dynamo_counters()
        try:
            got, scopes, mem_kind, samples = profiled(None)
        except Exception as err:
            if level != "detail" or dev.type == "npu" or not is_stack_failure(err):
                raise
            # torch.profiler could not decode a Python frame (a file or function name that
            # is not UTF-8): the step is fine, only the stacks are lost. Run it again
            # without them rather than lose the profile.
            stacks_dropped = " ".join(str(err.__context__ or err).split())[:200]
            log.warning("detail profile without Python stacks: %s", stacks_dropped)
            say("stack collection failed; profiling again without Python stacks")
            got, scopes, mem_kind, samples = profiled(False)
        after = dynamo_counters()
        counters = counter_delta(before, after)
        # Graph breaks are found when a frame is compiled (the warmup), not when it runs.
        counters["warmup"] = counter_delta(first, before)
    except TuneError:
        raise
    except Exception as err:
        if type(err).__module__.startswith("pypto_bench"):
            raise from_bench_error(err) from err
        raise ProfileFailedError(
            f"the profiled step raised {type(err).__name__}: {' '.join(str(err).split())[:300]}"
        ) from err
    if dtype is None and model is not None:
        tensors = [*model.parameters(), *model.buffers()]
        dtype = tensors[0].dtype if tensors else None
    measured: dict[str, Any] = {}
    if peaks:
        say("measuring peaks (matmul, bandwidth)")
        measured = measure_peaks(dev, dtype)
    assert got.trace is not None
    classes = scopes.classes if scopes is not None else None
    attributed: dict[str, Any] | None = None
    if attribution is not None:
        say("attributing the captured step's kernels to modules")
        classes, attributed = attribution(got.trace)
    full_meta = {
        "regime": regime,
        "level": level,
        "iters": iters,
        "warmup": warmup,
        "device": str(dev),
        "device_type": dev.type,
        "dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
        "profiler": got.trace.backend,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": time.time() - started,
        "arm": "eager" if model is not None else "step",
        # Where a vendor profiler wrote its own output (the NPU's *_ascend_pt folder).
        "profiler_output": str(got.output_dir) if got.output_dir is not None else None,
    }
    full_meta["stacks"] = level == "detail" and stacks_dropped is None
    if attributed is not None:
        full_meta["attribution"] = attributed
    full_meta.update(meta or {})
    valid = [m for m in samples if m is not None]
    memory = {
        "kind": mem_kind,
        "per_iter": samples,
        "growth": (valid[-1] - valid[0]) if len(valid) > 1 else 0,
    }
    prof = summarize(
        got.trace,
        regime=regime,
        meta=full_meta,
        peaks=measured,
        classes=classes,
        counters=counters,
        memory=memory,
    )
    if stacks_dropped is not None:
        prof.warnings.append(
            "Python stacks were not recorded: torch.profiler failed to collect them "
            f"({stacks_dropped}); the step was profiled again without stacks, every other "
            "detail figure is complete"
        )
    if attributed is not None and attributed.get("status") != "ok":
        prof.warnings.append(
            f"the captured step is one block: its kernels were not attributed to modules "
            f"({attributed.get('why')})"
        )
    if model is None:
        for op in prof.ops:
            if op.module is None:
                op.block = "captured"
        _rebuild_blocks(prof)
    if replay_probe and peaks and model is not None:
        from .summary import heavy_calls

        say("measuring a captured step's fixed cost at this model's structure")
        try:
            prof.peaks["replay"] = measure_replay_overhead(
                dev,
                tensors=sum(1 for _ in model.parameters()) + sum(1 for _ in model.buffers()),
                segments=round(heavy_calls(prof.ops)),
            )
        except Exception as err:  # no capture here: the estimate goes without it
            log.warning("replay probe skipped: %s", err)
    if kv_shapes and peaks:
        from .detect import kv_layout_suspects
        from .microbench import kv_layout_times

        if kv_layout_suspects(prof):
            say("microbenchmark: KV-cache layouts at this model's shapes")
            prof.microbench["kv_layout"] = kv_layout_times(**kv_shapes, device=dev, dtype=dtype)
    return prof


#: Arms whose step pypto-capture compiles or captures (hf-compile is transformers' own).
CAPTURED_ARMS = ("graph", "pypto+graph")


def replay_reference(recorder: Any, model: Any, device: Any) -> Callable[[Callable[[], Any]], Any]:
    """What a device graph's capture runs first (``recording(reference=...)``): the step
    once, profiled and not captured, its kernels each given a module (from the compiled
    graph's provenance when the step is compiled, else from module scopes): the sequence
    the replays are matched to."""
    import tempfile

    import torch

    from .graphmap import attribute_captured, reference_from_provenance, reference_from_trace
    from .summary import attribute

    def run(fn: Callable[[], Any]) -> Any:
        compiled = bool(recorder.graphs)
        # Scopes wrap module forwards: never around a compiled step (its guards would see
        # the wrappers); a compiled step's operators get modules from its provenance.
        scopes = ModuleScopes(model, prefill_marks=False) if not compiled else None
        with tempfile.TemporaryDirectory(prefix="pypto-tune-reference-") as tmp:
            try:
                if scopes is not None:
                    scopes.attach()
                with raw_profile(level="light", device=device, output_dir=tmp) as got:
                    fn()
                    if torch.device(device).type == "cuda":
                        torch.cuda.synchronize()
            finally:
                if scopes is not None:
                    scopes.detach()
        trace = got.trace
        assert trace is not None
        if compiled:
            refs = [reference_from_provenance(g, model) for g in recorder.graphs]
            done = attribute_captured(trace, refs)
            if done.get("status") != "ok":
                raise RuntimeError(f"the reference run was not attributed: {done.get('why')}")
        else:
            attribute(trace)
        return reference_from_trace(trace)

    return run


def graph_attribution(
    recorder: Any, model: Any
) -> Callable[[RawTrace], tuple[dict[str, str], dict[str, Any]]]:
    """The ``attribution`` for :func:`profile_step` of a step compiled under
    ``pypto_capture.provenance.recording()`` (``recorder``) from ``model``."""
    from .graphmap import attribute_captured, mark_graph_wrappers, reference_from_provenance

    def attribute(trace: RawTrace) -> tuple[dict[str, str], dict[str, Any]]:
        started = time.perf_counter()
        classes: dict[str, str] = {}
        if recorder.compile_s > 0:  # compiled here: every kernel has its profiler range
            mark_graph_wrappers(trace)
        if recorder.references:  # a device graph: its replays matched to a reference run
            report: dict[str, Any] = attribute_captured(
                trace, list(recorder.references), classes=classes
            )
        elif recorder.unavailable is not None:
            report = {"status": "fallback", "why": recorder.unavailable}
        elif not recorder.graphs:
            why = "; ".join(recorder.errors) or (
                "no graph was compiled while recording (a device-graph backend replays the "
                "eager step: its kernel sequence is not recorded here)"
            )
            report = {"status": "fallback", "why": why}
        else:
            refs = [reference_from_provenance(g, model) for g in recorder.graphs]
            report = attribute_captured(trace, refs, classes=classes)
        report["cost"] = {
            "compile_s": round(recorder.compile_s, 3),
            "match_s": round(time.perf_counter() - started, 4),
            "note": (
                "outside the profiled steps: the step was compiled once more with provenance "
                "tracking and without the FX graph cache (compile_s); each profiled kernel "
                "runs inside one profiler range"
            ),
        }
        return classes, report

    return attribute


def profile_model(
    config: Any,
    *,
    arm: str = "eager",
    level: str = "light",
    iters: int = 3,
    warmup: int = 1,
    peaks: bool = True,
    output_dir: str | None = None,
    progress: ProgressFn | None = None,
) -> Profile:
    """Profile ``iters`` bench iterations of ``arm`` under ``config`` (a ``BenchConfig``).

    Module scopes are attached for the eager arm only (the hooks would be traced into
    a graph). A graph arm's step is compiled under provenance recording and its kernels
    are attributed to modules from what inductor recorded (:mod:`.graphmap`); what
    cannot be attributed is the ``captured`` block, and ``meta["attribution"]`` says how
    much that is and why. Raises ``BadInputError`` /
    ``EnvironmentMissingError`` for bad requests and ``ProfileFailedError`` when the
    step itself raises.
    """
    import torch

    import pypto_bench

    _validate(level, iters, warmup)
    if arm not in pypto_bench.ARMS:
        raise BadInputError(f"unknown arm {arm!r}: choose from {', '.join(pypto_bench.ARMS)}")
    say = progress or (lambda _m: None)
    try:
        session = pypto_bench.open_session(config)
    except pypto_bench.BenchError as err:
        raise from_bench_error(err) from err
    cfg = session.config
    say(f"{arm}: building the step")
    from pypto_capture.provenance import recording

    try:
        with contextlib.ExitStack() as stack:
            recorder = None
            if arm in CAPTURED_ARMS:
                recorder = stack.enter_context(recording())
                if torch.device(session.device).type in ("cuda", "npu"):
                    recorder.reference = replay_reference(recorder, session.model, session.device)
            once = stack.enter_context(session.iteration(arm))
            prof = profile_step(
                once,
                device=session.device,
                level=level,
                iters=iters,
                warmup=warmup,
                model=session.model if arm == "eager" else None,
                regime=cfg.regime,
                peaks=peaks,
                dtype=next(session.model.parameters()).dtype,
                kv_shapes=_kv_shapes(session.model, cfg),
                replay_probe=arm == "eager",
                meta={"arm": arm},
                output_dir=output_dir,
                progress=lambda m: say(f"{arm}: {m}"),
                attribution=(
                    graph_attribution(recorder, session.model) if recorder is not None else None
                ),
            )
            details = dict(getattr(session, "details", {}))
    except TuneError:
        raise
    except pypto_bench.BenchError as err:
        raise from_bench_error(err) from err
    except Exception as err:
        raise ProfileFailedError(
            f"the {arm} step raised {type(err).__name__}: {' '.join(str(err).split())[:300]}"
        ) from err
    prof.meta.update(
        {
            "model": session.model_info,
            "arm_details": _jsonable(details),
            "batch": cfg.batch,
            "seq": cfg.seq,
            "gen": cfg.gen,
            "bench_config": cfg.to_dict(),
            "kernel_plugins": kernel_plugins_for(session.model),
            "model_shapes": _model_shapes(session.model, cfg),
        }
    )
    prof.warnings.extend(session.warnings)
    return prof


def _model_shapes(model: Any, cfg: Any) -> dict[str, int]:
    """The sizes a tile search needs: rows per step (decode: the batch; else batch x
    sequence), hidden and MLP intermediate size."""
    c = model.config
    getter = getattr(c, "get_text_config", None)
    c = getter() if callable(getter) else c
    rows = int(cfg.batch) if cfg.regime == "decode" else int(cfg.batch) * int(cfg.seq)
    out = {"rows": rows}
    for key, attr in (("hidden", "hidden_size"), ("inter", "intermediate_size")):
        value = getattr(c, attr, None)
        if isinstance(value, int):
            out[key] = value
    return out


def _kv_shapes(model: Any, cfg: Any) -> dict[str, int] | None:
    from .microbench import attention_shapes

    try:
        return attention_shapes(model, int(cfg.batch), int(cfg.seq + cfg.gen))
    except (AttributeError, TypeError, ValueError):
        return None


def kernel_plugins_for(model: Any) -> list[dict[str, Any]]:
    """The installed kernel plug-ins that apply to ``model``, with their tunable kernels
    (what the advice can switch on or tile-search)."""
    from pypto_bench import discover_plugins

    out: list[dict[str, Any]] = []
    try:
        plugins = discover_plugins()
    except Exception as err:  # a broken plug-in must not stop a profile
        log.warning("kernel plug-ins not listed: %s", err)
        return out
    for plugin in plugins:
        try:
            applies = bool(plugin.applies_to(model))
        except Exception:
            applies = False
        if not applies:
            continue
        tunables = getattr(plugin, "tunables", None)
        try:
            found = tunables() if callable(tunables) else {}
            shapes = {str(k): list(getattr(v, "shape_names", ())) for k, v in found.items()}
        except Exception:
            shapes = {}
        out.append({"name": str(plugin.name), "tunables": shapes})
    return out


def _rebuild_blocks(prof: Profile) -> None:
    from .summary import op_time

    device = prof.meta.get("device_type", "cpu")
    step_us = prof.step_us
    gaps = prof.blocks.get("host gaps", {"us": 0.0})
    blocks: dict[str, dict[str, float]] = {}
    for op in prof.ops:
        b = blocks.setdefault(op.block, {"us": 0.0, "share": 0.0})
        b["us"] += op_time(op, device)
    blocks["host gaps"] = {"us": gaps["us"], "share": 0.0}
    for b in blocks.values():
        b["share"] = b["us"] / step_us if step_us else 0.0
    prof.blocks = blocks


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


class profile(raw_profile):
    """Profile a block of your own code; with ``model=`` you get module attribution.

    ``with profile(model=m) as got: m(x)`` attaches a profiler range to every submodule
    of ``m`` for the block and yields a :class:`Profile` that is filled when the block
    ends: ``got.step_us``, ``got.blocks``, ``got.ops`` (each with its module),
    ``got.call_graph``, and ``advise(got)`` works on it. Each forward of ``m`` is a step;
    with ``regime="decode"`` a forward over more than one position (a prompt) is not.
    Without ``model`` it yields the raw collection (``got.trace``, a :class:`RawTrace`)
    as before; ``@profile(...)`` on a function profiles each call (``wrapper.last``).
    """

    def __init__(self, *, model: Any = None, regime: str = "prefill", **options: Any) -> None:
        """``options``: the raw profiler's (``level``, ``device``, ``output_dir``,
        ``with_stack``)."""
        super().__init__(**options)
        if model is not None and not callable(getattr(model, "named_modules", None)):
            raise TypeError(
                f"profile(model=...) takes a torch.nn.Module, got {type(model).__name__}: "
                "pass the model whose forward runs inside the block"
            )
        self.model = model
        self.regime = regime
        self._scopes: ModuleScopes | None = None
        self._result: Profile | None = None

    def __enter__(self) -> Any:
        if self.model is None:
            return super().__enter__()
        self._scopes = ModuleScopes(self.model, prefill_marks=self.regime == "decode").attach()
        try:
            super().__enter__()
        except BaseException:
            self._scopes.detach()
            raise
        self._result = Profile(meta={}, peaks={}, step={}, ops=[], blocks={}, call_graph=[])
        return self._result

    def __exit__(self, *exc: object) -> None:
        if self.model is None:
            super().__exit__(*exc)
            return
        assert self._scopes is not None
        assert self._result is not None
        try:
            super().__exit__(*exc)
        finally:
            self._scopes.detach()
        collected = self._collected
        if exc[0] is not None or collected is None or collected.trace is None:
            return
        import torch

        trace = collected.trace
        done = summarize(
            trace,
            regime=self.regime,
            meta={
                "regime": self.regime,
                "level": self.level,
                "device_type": self.device_type,
                "profiler": trace.backend,
                "arm": "eager",
                "model": {"class": type(self.model).__name__},
                "torch": torch.__version__,
                "python": platform.python_version(),
            },
            classes=self._scopes.classes,
        )
        vars(self._result).update(vars(done))
