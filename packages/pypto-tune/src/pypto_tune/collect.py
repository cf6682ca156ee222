"""Collection: a profiler session on the right backend, and module scopes.

``profile()`` is the library entry point (a context manager and a decorator). It picks
the backend from the device: ``torch.profiler`` on CPU and CUDA, ``torch_npu.profiler``
on Ascend (:mod:`.npu`). Module attribution is not the profiler's job (torch's
``with_modules`` covers TorchScript only): :class:`ModuleScopes` opens one named range
around each module's forward, and every operator is later given the innermost range
that contains it.
"""

from __future__ import annotations

import functools
import logging
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import BadInputError, EnvironmentMissingError
from .records import MODULE_SCOPE_PREFIX, ROOT_SCOPE, STEP_MARKERS, OpEvent, RawTrace, Span

__all__ = [
    "ITERATION_MARKER",
    "LAUNCH_PROBE",
    "LEVELS",
    "PREFILL_MARKER",
    "STEP_MARKER",
    "Collected",
    "ModuleScopes",
    "TorchProfilerSession",
    "is_stack_failure",
    "iterate_marked",
    "launch_probe",
    "profile",
]

log = logging.getLogger(__name__)

LEVELS = ("light", "detail")
#: Range around one bench iteration (the step when nothing inside marks steps).
ITERATION_MARKER = "pypto_tune.iteration"
#: Range around an eager forward that processes the prompt (excluded from decode steps).
PREFILL_MARKER = "pypto_tune.prefill"
STEP_MARKER = "pypto_tune.step"
#: Range around empty operator calls run under the same profiler settings: what one
#: operator costs when it does no work, as this profile records it.
LAUNCH_PROBE = "pypto_tune.launch_probe"


def launch_probe(device: Any, n: int = 200) -> None:
    """Run ``n`` empty operators inside a ``LAUNCH_PROBE`` range (call under a profiler)."""
    torch = _torch()
    a = torch.ones(1, device=device)
    out = torch.empty_like(a)
    with torch.profiler.record_function(LAUNCH_PROBE), torch.inference_mode():
        for _ in range(n):
            torch.add(a, a, out=out)


_OWN_PREFIXES = ("pypto_tune.", "pypto_capture::")


def _torch() -> Any:
    import torch

    return torch


def _range_factory() -> Callable[[str], Any]:
    """The cheapest profiler range this torch has: the C++ ``_RecordFunctionFast`` (about
    0.5 us per range here, what inductor uses) or ``record_function`` (about 5 us)."""
    torch = _torch()
    fast = getattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast", None)
    return fast if fast is not None else torch.profiler.record_function


class ModuleScopes:
    """Named profiler ranges around every submodule's forward (eager execution only).

    The root module's forward is a step (``pypto_tune.step``), or a prefill
    (``pypto_tune.prefill``) when its input holds more than one position and
    ``prefill_marks`` is on: that is how a ``generate`` call's first forward is told
    apart from its decode steps. Submodules get their ``forward`` wrapped (an instance
    attribute, removed on detach) rather than hooks: any hook sends every call through
    ``Module.__call__``'s slow path, about 5 us per module call on CPU, which made the
    scopes most of the light level's overhead. Do not attach scopes to a model you are
    about to ``torch.compile``: the wrappers would be traced into the graph.
    """

    def __init__(self, model: Any, *, prefill_marks: bool = True) -> None:
        self.model = model
        self.prefill_marks = prefill_marks
        self.root_name = ROOT_SCOPE
        self.classes: dict[str, str] = {ROOT_SCOPE: type(model).__name__}
        self._handles: list[Any] = []
        self._wrapped: list[tuple[Any, Any]] = []  # (module, instance forward it had, or None)
        self._stack: list[Any] = []
        self._range = _range_factory()

    def _root_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        if not _torch().autograd._profiler_enabled():
            self._stack.extend([None, None])
            return
        label = STEP_MARKER
        if self.prefill_marks and _positions(args, kwargs) > 1:
            label = PREFILL_MARKER
        for name in (label, MODULE_SCOPE_PREFIX + self.root_name):
            # The root's own operators belong to it (named by its class), so code in the
            # top-level forward is told apart from the loop around it.
            rf = self._range(name)
            rf.__enter__()
            self._stack.append(rf)

    def _root_post(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        for _ in range(2):
            if self._stack:
                rf = self._stack.pop()
                if rf is not None:
                    rf.__exit__(None, None, None)

    def _wrap(self, module: Any, name: str) -> None:
        had = module.__dict__.get("forward")
        inner = module.forward
        label = MODULE_SCOPE_PREFIX + name
        enabled = _torch().autograd._profiler_enabled
        make = self._range

        @functools.wraps(inner)
        def forward(*args: Any, **kwargs: Any) -> Any:
            if not enabled():
                return inner(*args, **kwargs)
            with make(label):
                return inner(*args, **kwargs)

        module.forward = forward
        self._wrapped.append((module, had))

    def attach(self) -> ModuleScopes:
        for name, module in self.model.named_modules():
            if not name:
                self._handles.append(
                    module.register_forward_pre_hook(self._root_pre, with_kwargs=True)
                )
                self._handles.append(
                    module.register_forward_hook(
                        self._root_post, with_kwargs=True, always_call=True
                    )
                )
                continue
            self.classes[name] = type(module).__name__
            self._wrap(module, name)
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for module, had in reversed(self._wrapped):
            if had is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = had
        self._wrapped.clear()
        while self._stack:
            rf = self._stack.pop()
            if rf is not None:
                rf.__exit__(None, None, None)

    def __enter__(self) -> ModuleScopes:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()


def _positions(args: Any, kwargs: Any) -> int:
    """Sequence length of a forward's token input (1 for a decode step)."""
    for value in [kwargs.get("input_ids"), kwargs.get("inputs_embeds"), *args]:
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) >= 2:
            return int(shape[1])
    return 1


class TorchProfilerSession:
    """``torch.profiler`` on CPU (and CUDA): light = operator timings, detail = shapes,
    memory, stacks and FLOP estimates."""

    def __init__(self, *, level: str, device_type: str, with_stack: bool | None = None) -> None:
        torch = _torch()
        acts = [torch.profiler.ProfilerActivity.CPU]
        if device_type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        detail = level == "detail"
        self.device_type = device_type
        self.level = level
        self._torch_trace: str | None = None  # torch's Chrome trace, marked, once exported
        self._prof = torch.profiler.profile(
            activities=acts,
            record_shapes=detail,
            profile_memory=detail,
            with_stack=detail if with_stack is None else with_stack,
            with_flops=detail,
        )

    def __enter__(self) -> TorchProfilerSession:
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._prof.__exit__(None, None, None)

    def trace(self) -> RawTrace:
        torch = _torch()
        events: list[OpEvent] = []
        modules: list[Span] = []
        steps: list[Span] = []
        cpu = torch.autograd.DeviceType.CPU
        for e in self._prof.events():
            start, end = float(e.time_range.start), float(e.time_range.end)
            name = str(e.name)
            if e.device_type != cpu:
                events.append(
                    OpEvent(
                        name=name,
                        start_us=start,
                        dur_us=end - start,
                        device_us=end - start,
                        kind="kernel",
                        thread=-1,
                    )
                )
                continue
            if getattr(e, "is_python_function", False):
                continue  # with_stack's Python frames: stacks are kept on the operators
            thread = int(e.thread)
            if name.startswith(MODULE_SCOPE_PREFIX):
                modules.append(Span(name[len(MODULE_SCOPE_PREFIX) :], start, end, thread))
                continue
            if name.startswith(_OWN_PREFIXES):
                steps.append(Span(name, start, end, thread))
                continue
            parent = e.cpu_parent
            while parent is not None and (
                str(parent.name).startswith(_OWN_PREFIXES)
                or getattr(parent, "is_python_function", False)
            ):
                parent = parent.cpu_parent
            shapes = [list(s) for s in e.input_shapes] if e.input_shapes else None
            dtypes = list(getattr(e, "input_dtypes", None) or []) or None
            flops = float(e.flops) if getattr(e, "flops", 0) else None
            device_us = float(e.self_device_time_total) if self.device_type != "cpu" else None
            events.append(
                OpEvent(
                    name=name,
                    start_us=start,
                    dur_us=end - start,
                    self_us=float(e.self_cpu_time_total),
                    device_us=device_us,
                    thread=thread,
                    shapes=shapes,
                    dtypes=dtypes,
                    flops=flops,
                    top=parent is None,
                    extra=_op_extra(e),
                )
            )
        return RawTrace(
            events=events,
            modules=modules,
            steps=steps,
            device_type=self.device_type,
            backend="torch.profiler",
            native_export=_SharedExport(self.export_torch_trace),
        )

    def export_torch_trace(self, path: Path) -> Path:
        """torch.profiler's own Chrome trace of the session at ``path``, each step also
        marked ``ProfilerStep#<n>`` (what torch's scheduled profiler records, and what
        Holistic Trace Analysis's step-based analyses look for): a twin slice with the
        step's own bounds, on its track. Written whole or not at all."""
        from pypto_common import atomic_write_text

        if self._torch_trace is None:  # torch.profiler exports a session once, so keep it
            self._torch_trace = self._marked_torch_trace()
        atomic_write_text(path, self._torch_trace)
        return path

    def _marked_torch_trace(self) -> str:
        import json

        with tempfile.TemporaryDirectory(prefix="pypto-tune-trace-") as tmp:
            raw = Path(tmp) / "trace.json"
            self._prof.export_chrome_trace(str(raw))
            data = json.loads(raw.read_text(encoding="utf-8"))
        events = data.get("traceEvents") if isinstance(data, dict) else None
        if not isinstance(events, list):
            raise ValueError("torch.profiler wrote a trace without traceEvents")
        marks = sorted(
            (
                e
                for e in events
                if isinstance(e, dict) and e.get("ph") == "X" and e.get("name") in STEP_MARKERS
            ),
            key=lambda e: (float(e.get("ts", 0)), -float(e.get("dur", 0))),
        )

        def end(e: dict[str, Any]) -> float:
            return float(e.get("ts", 0)) + float(e.get("dur", 0))

        steps: list[dict[str, Any]] = []
        for e in marks:  # the outermost mark of a step (a replay inside an eager mark)
            last = steps[-1] if steps else None
            track = (e.get("pid"), e.get("tid"))
            if (
                last is not None
                and track == (last.get("pid"), last.get("tid"))
                and end(e) <= end(last)
            ):
                continue
            steps.append(e)
        for n, e in enumerate(steps):
            events.append({**e, "name": f"ProfilerStep#{n}", "cat": "user_annotation"})
        return json.dumps(data)


class _SharedExport:
    """A session's trace writer on a :class:`RawTrace`: copies of the trace share it (the
    profiler's result it reads cannot be copied), so a profile stays deep-copyable."""

    def __init__(self, write: Callable[[Path], Path]) -> None:
        self._write = write

    def __call__(self, path: Path) -> Path:
        return self._write(path)

    def __copy__(self) -> _SharedExport:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _SharedExport:
        return self


def _op_extra(e: Any) -> dict[str, Any]:
    """A host operator's extras: its Python stack (detail level) and, on CUDA, the names
    of the kernels it launched, in order (what a replayed graph's kernels are matched to)."""
    extra: dict[str, Any] = {}
    if getattr(e, "stack", None):
        extra["stack"] = list(e.stack)[:6]
    kernels = [str(k.name) for k in getattr(e, "kernels", None) or []]
    if kernels:
        extra["kernels"] = kernels
    return extra


class Collected:
    """What ``profile()`` leaves behind: the raw trace, filled on exit."""

    def __init__(self, level: str, device_type: str) -> None:
        self.level = level
        self.device_type = device_type
        self.trace: RawTrace | None = None
        self.output_dir: Path | None = None


def _session(
    level: str, device_type: str, out_dir: Path | None, with_stack: bool | None = None
) -> Any:
    if device_type == "npu":
        from .npu import NpuProfilerSession

        folder = out_dir or Path(tempfile.mkdtemp(prefix="pypto-tune-npu-"))
        return NpuProfilerSession(level=level, out_dir=folder)
    if device_type not in ("cpu", "cuda"):
        raise EnvironmentMissingError(
            f"no profiler backend for device type {device_type!r}: use cpu, cuda or npu"
        )
    return TorchProfilerSession(level=level, device_type=device_type, with_stack=with_stack)


def is_stack_failure(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it arose from) is torch.profiler's Python-stack
    collection failing to decode a frame (a file or function name that is not UTF-8):
    the step itself is fine and runs again without stacks."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        text = str(e).lower()
        if isinstance(e, UnicodeError) or "utf-8" in text or "utf8" in text:
            return True
        todo += [e.__cause__, e.__context__]
    return False


class profile:
    """Profile a block or a function on the device's own profiler.

    ``with profile(level="light", device="cpu") as got: step()`` leaves ``got.trace``
    (a :class:`RawTrace`); ``@profile(...)`` on a function profiles each call and keeps
    the last trace on ``wrapper.last``. Use :func:`pypto_tune.summarize` (or
    ``profile_model``) to turn a trace into a :class:`Profile`.
    """

    def __init__(
        self,
        *,
        level: str = "light",
        device: Any = "cpu",
        output_dir: str | Path | None = None,
        with_stack: bool | None = None,
    ) -> None:
        if level not in LEVELS:
            raise BadInputError(f"unknown level {level!r}: choose light or detail")
        self.level = level
        self.device_type = _torch().device(device).type
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.with_stack = with_stack  # None: the level decides (detail records stacks)
        self._session: Any = None
        self._collected: Collected | None = None

    def __enter__(self) -> Collected:
        self._collected = Collected(self.level, self.device_type)
        self._session = _session(self.level, self.device_type, self.output_dir, self.with_stack)
        self._session.__enter__()
        return self._collected

    def __exit__(self, *exc: object) -> None:
        self._session.__exit__(*exc)
        assert self._collected is not None
        self._collected.trace = self._session.trace()
        self._collected.output_dir = getattr(self._session, "out_dir", self.output_dir)

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        outer = self

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            session = profile(
                level=outer.level,
                device=outer.device_type,
                output_dir=outer.output_dir,
                with_stack=outer.with_stack,
            )
            with session as got:
                torch = _torch()
                with torch.profiler.record_function(ITERATION_MARKER):
                    result = fn(*args, **kwargs)
            wrapper.last = got.trace  # type: ignore[attr-defined]
            return result

        wrapper.last = None  # type: ignore[attr-defined]
        return wrapper


def iterate_marked(fn: Callable[[], Any], n: int) -> Iterator[Any]:
    """Run ``fn`` ``n`` times, each inside an iteration range."""
    torch = _torch()
    for _ in range(n):
        with torch.profiler.record_function(ITERATION_MARKER):
            yield fn()
