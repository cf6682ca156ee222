"""Graph backends behind one interface, and ``capture_and_replay``.

A backend turns a zero-argument *step* (a function that reads and writes fixed
buffers) into something replayable:

- ``npugraph`` / ``cudagraph``: real stream capture and replay. Warmup runs on a side
  stream (capture on the default stream is illegal, and warmup there would leave
  allocator state the capture cannot see), and graphs of one backend instance share a
  memory pool.
- ``compile``: ``torch.compile(fullgraph=True, dynamic=False)``. It is the backend that
  runs on CPU, so tests exercise the same "one graph, fixed shapes" contract there: a
  graph break is a capture failure with a reason, like a capture error on a device.
- ``fused``: compile, then capture (the gpt-fast approach). A captured eager step
  replays the eager step's many small kernels, so a batch-1 decode stays launch/latency
  bound; inductor first fuses them into fewer, larger kernels and the device graph then
  removes the launches. CUDA: ``torch.compile`` (fullgraph, static shapes, no CUDA graphs
  of its own) warmed up on the side stream, then the *compiled* step captured manually in
  a CUDA graph. NPU: torchair's NPU backend in ``reduce-overhead`` mode (torchair captures
  the compiled graph into an NPU graph itself). CPU has no device graphs: the compiled
  step is the whole backend there, the same code path up to the capture stage, which is
  how the CPU tests exercise it. ``auto`` picks ``fused`` on CUDA and falls back to plain
  ``cudagraph`` (logged, with the reason in ``fallback_reason``) when compiling fails.
- ``eager``: no capture at all; the same step, as a baseline.
"""

from __future__ import annotations

import contextlib
import logging
import time
import types
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .device import (
    current_stream,
    graph_capture,
    graph_pool_handle,
    new_graph,
    new_stream,
    resolve_device,
    stream_context,
    synchronize,
)
from .errors import (
    CacheApiNotSupportedError,
    CacheDoesNotFitError,
    CaptureFailedError,
    CaptureUnsafeConfigError,
    DeviceNotAvailableError,
    PyptoCaptureError,
    UnsupportedModelError,
)
from .explain import exception_chain, explain_capture_error, traced_exception

log = logging.getLogger(__name__)

__all__ = [
    "BACKENDS",
    "CapturedStep",
    "CompileBackend",
    "DeviceGraphBackend",
    "EagerBackend",
    "FusedBackend",
    "GraphBackend",
    "ReplayResult",
    "auto_backend_name",
    "capture_and_replay",
    "make_backend",
    "resolve_backend_name",
]

BACKENDS = ("auto", "npugraph", "cudagraph", "compile", "fused", "eager")


class CapturedStep(ABC):
    """A captured step: ``replay()`` runs it once more and returns its (static) output."""

    output: Any = None

    @abstractmethod
    def replay(self) -> Any: ...


class GraphBackend(ABC):
    """Capture a zero-argument step once; replay it many times with fixed shapes."""

    name: str = ""

    def __init__(self, device: torch.device):
        self.device = device

    @abstractmethod
    def capture(self, fn: Callable[[], Any], *, warmup: int = 3) -> CapturedStep:
        """Warm ``fn`` up and capture it. Raises CaptureFailedError with an explanation."""

    @property
    def autotune(self) -> dict[str, Any] | None:
        """What inductor's autotuning chose in this backend's last compile
        (:mod:`pypto_capture.autotune`); None where nothing compiled with autotuning."""
        return None

    def _fail(self, err: BaseException, what: str = "capture") -> PyptoCaptureError:
        refusal = _own_refusal(err)
        if refusal is not None:
            return refusal
        expl = explain_capture_error(err)
        message = f"{self.name} {what} failed: {expl}"
        # The explanation names the underlying error itself only for model_error; say it
        # for every other code too, so the one line holds what the traceback would.
        if expl.underlying and expl.underlying not in message:
            message += f" [underlying error: {_clip(expl.underlying)}]"
        exc = CaptureFailedError(message, expl)
        exc.__cause__ = err
        return exc


#: This package's one-line refusals: raised inside a compiled step they reach the backend
#: wrapped by dynamo, and stay refusals (the eager backend lets them through as they are).
_REFUSALS: dict[str, type[PyptoCaptureError]] = {
    c.__name__: c
    for c in (
        UnsupportedModelError,
        CacheApiNotSupportedError,
        CaptureUnsafeConfigError,
        CacheDoesNotFitError,
    )
}


def _own_refusal(err: BaseException) -> PyptoCaptureError | None:
    """The refusal of this package's own under a capture failure, as a fresh exception of
    its class with its whole message (so a CLI prints the refusal, not "compile capture
    failed [underlying ...]"), or None."""
    for cur in exception_chain(err):
        if type(cur).__name__ in _REFUSALS and isinstance(cur, PyptoCaptureError):
            return type(cur)(str(cur))
    traced = traced_exception(err)
    if traced is not None and traced[0] in _REFUSALS:
        return _REFUSALS[traced[0]](" ".join(traced[1].split()))
    return None


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _EagerStep(CapturedStep):
    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn

    def replay(self) -> Any:
        self.output = self.fn()
        return self.output


class EagerBackend(GraphBackend):
    """No capture: the baseline arm runs the very same step eagerly."""

    name = "eager"

    def capture(self, fn: Callable[[], Any], *, warmup: int = 3) -> CapturedStep:
        return _EagerStep(fn)


class _DeviceGraphStep(CapturedStep):
    def __init__(self, graph: Any, output: Any):
        self.graph = graph
        self.output = output

    def replay(self) -> Any:
        self.graph.replay()
        return self.output


class DeviceGraphBackend(GraphBackend):
    """Stream capture on CUDA or an Ascend NPU (torch.accelerator.Graph where available)."""

    def __init__(self, device: torch.device, name: str):
        super().__init__(device)
        self.name = name
        self._pool: Any | None = None

    def capture(self, fn: Callable[[], Any], *, warmup: int = 3) -> CapturedStep:
        dev = self.device
        try:
            side = new_stream(dev)
            main = current_stream(dev)
            side.wait_stream(main)
            # Warm up on the side stream: lazy inits, autotuning and allocator growth happen
            # here, outside the capture, on the same stream the capture will use.
            with stream_context(side):
                for _ in range(max(1, warmup)):
                    fn()
            main.wait_stream(side)
            synchronize(dev)
            _before_capture(fn)
            graph = new_graph(dev, pool=self._pool)
            with graph_capture(graph, dev, side, pool=self._pool):
                out = fn()
            synchronize(dev)
            if self._pool is None:
                self._pool = graph_pool_handle(dev, graph)
        except CaptureFailedError:
            raise
        except Exception as err:  # capture errors come as RuntimeError with ACL/CUDA codes
            raise self._fail(err) from err
        return _DeviceGraphStep(graph, out)


def _before_capture(fn: Callable[[], Any]) -> None:
    """Let an active provenance recorder run the step once, not captured, to record the
    kernel sequence the capture will replay (``pypto_capture.provenance``)."""
    from .provenance import active_recorder

    recorder = active_recorder()
    if recorder is not None:
        recorder.before_capture(fn)


class _CompiledStep(CapturedStep):
    def __init__(self, compiled: Callable[[], Any], backend: CompileBackend, output: Any):
        self.compiled = compiled
        self.backend = backend
        self.output = output

    def replay(self) -> Any:
        # A recompile here means a guard failed (a shape or Python value changed): that is
        # the CPU analogue of replaying a graph whose inputs moved, so it is an error.
        try:
            with _no_recompile():
                self.output = self.compiled()
        except Exception as err:
            raise self.backend._fail(err, "replay") from err
        return self.output


@contextlib.contextmanager
def _no_recompile():
    cfg = getattr(getattr(torch, "_dynamo", None), "config", None)
    if cfg is not None and hasattr(cfg, "error_on_recompile"):
        with cfg.patch(error_on_recompile=True):
            yield
    else:  # pragma: no cover - every supported torch has it
        yield


def _fresh_function(fn: Callable[[], Any]) -> Callable[[], Any]:
    """A copy of ``fn`` with its own code object.

    Dynamo keeps its compiled-graph cache on the code object, so every runner built from the
    same source line would share (and exhaust) one cache; a fresh code object gives each
    capture its own, and a recompile then really means a guard failed. A bound method (the
    decode runner captures ``self._step``) gets a fresh copy of its function, bound to the
    same object: otherwise every runner in a process shares one cache and the ninth model
    compiled hits dynamo's recompile limit.
    """
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return types.MethodType(_fresh_function(fn.__func__), fn.__self__)
    if not isinstance(fn, types.FunctionType):
        return fn
    code = fn.__code__.replace()
    new = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


class CompileBackend(GraphBackend):
    """torch.compile with fullgraph=True and static shapes; the CPU stand-in for capture."""

    name = "compile"

    def __init__(
        self,
        device: torch.device,
        mode: str | None = None,
        freezing: bool | None = None,
        cpp_wrapper: bool | None = None,
    ):
        super().__init__(device)
        self.mode = mode if mode is not None else "default"
        # Inductor "freezing" folds the weights into the graph as constants and pre-packs
        # them for the CPU GEMM library: a batch-1 decode step is a chain of GEMVs that
        # read every weight once, and packed weights read measurably faster (0.5B fp32
        # decode on 2 cores: 59% -> 67% of the bandwidth ceiling). It only applies when
        # grads are off (inference), and weights must not change after capture, which a
        # captured step assumes anyway. Default: on for CPU, off elsewhere.
        self.freezing = (device.type == "cpu") if freezing is None else freezing
        # Inductor's C++ wrapper: the step's kernel calls are one compiled C++ function
        # instead of a generated Python module calling each kernel. On CPU that is the
        # nearest thing to a captured graph (the host's per-kernel Python cost is gone: a
        # tiny Llama's compiled decode step 1.09-1.31x faster, docs/benchmarks.md), and
        # its kernels compile as one translation unit instead of one shared library each
        # (gcc spends ~0.6 s loading inductor's precompiled header per unit, whatever the
        # kernel's size). Default: on for CPU, off elsewhere (CUDA's graph stage captures
        # the Python wrapper's launches). A step recorded for provenance keeps the Python
        # wrapper: its per-kernel profiler ranges and kernel names are that wrapper's.
        self.cpp_wrapper = (device.type == "cpu") if cpp_wrapper is None else cpp_wrapper
        #: The wrapper the last capture compiled with: "cpp", "python", or None before one.
        self.wrapper: str | None = None
        #: Why the last capture fell back from the C++ wrapper to the Python one (None: it
        #: did not).
        self.wrapper_fallback: str | None = None
        self._autotune: dict[str, Any] | None = None

    @property
    def autotune(self) -> dict[str, Any] | None:
        return self._autotune

    def capture(self, fn: Callable[[], Any], *, warmup: int = 3) -> CapturedStep:
        from .provenance import active_recorder

        recorder = active_recorder()
        cpp_wrapper = self.cpp_wrapper and recorder is None
        self.wrapper_fallback = None
        try:
            return self._compile(fn, warmup, recorder, cpp_wrapper)
        except Exception as err:  # dynamo Unsupported, inductor errors, capture errors
            if not (cpp_wrapper and _cpp_wrapper_unsupported(err)):
                raise self._fail(err) from err
            # A step the C++ wrapper cannot express (an op whose arguments it cannot pass:
            # a collective's process group) compiles with the Python one, and says so. The
            # failure is in code generation, before the step ever ran: no state moved.
            why = " ".join(f"{type(err).__name__}: {err}".split())
        try:
            step = self._compile(fn, warmup, recorder, False)
        except Exception as err:
            raise self._fail(err) from err
        self.wrapper_fallback = (
            f"inductor's C++ wrapper could not compile the step ({_clip(why)}); "
            "compiled with its Python wrapper"
        )
        log.warning("compile backend: %s", self.wrapper_fallback)
        return step

    def _compile(
        self, fn: Callable[[], Any], warmup: int, recorder: Any, cpp_wrapper: bool
    ) -> CapturedStep:
        import torch._inductor.config as inductor_config

        from .autotune import autotune_log

        tuned = "max-autotune" in str(self.mode)
        choices = autotune_log() if tuned else contextlib.nullcontext(None)
        if recorder is None:
            compiled = torch.compile(
                _fresh_function(fn), fullgraph=True, dynamic=False, mode=self.mode
            )
        else:  # the same inductor compile, its kernels' provenance recorded
            compiled = torch.compile(
                _fresh_function(fn),
                fullgraph=True,
                dynamic=False,
                backend=recorder.backend(self.mode),
            )
        out = None
        patch = inductor_config.patch(freezing=self.freezing, cpp_wrapper=cpp_wrapper)
        with patch, choices as seen:
            for _ in range(max(1, warmup)):  # the first call traces and compiles
                out = compiled()
        synchronize(self.device)
        self._autotune = seen.summary() if seen is not None else None
        self.wrapper = "cpp" if cpp_wrapper else "python"
        return _CompiledStep(compiled, self, out)


def _cpp_wrapper_unsupported(err: BaseException) -> bool:
    """Whether a compile failed in inductor's C++ wrapper itself: its code generation's
    NotImplementedError ("arg type ... is not yet supported by custom_op_wrapper") or its
    C++ not compiling."""
    return any(
        isinstance(cur, NotImplementedError) or type(cur).__name__ == "CppCompileError"
        for cur in exception_chain(err)
    )


class _CompiledReplay(CapturedStep):
    """The CPU form of a fused step: no device graph exists, the compiled step replays."""

    def __init__(self, inner: CapturedStep):
        self.inner = inner
        self.output = inner.output

    def replay(self) -> Any:
        self.output = self.inner.replay()
        return self.output


class FusedBackend(GraphBackend):
    """Compile the step with inductor, then capture the compiled step in a device graph.

    ``stages`` says what ran (``("compile", "cudagraph")`` on CUDA, ``("torchair
    reduce-overhead",)`` on NPU, ``("compile",)`` on CPU). With ``fallback`` (what
    ``auto`` asks for on CUDA) a failed compile stage is logged and the plain step is
    captured instead; ``fallback_reason`` then says why and ``stages`` is
    ``("cudagraph",)``: the report names what really ran.
    """

    name = "fused"

    def __init__(
        self,
        device: torch.device,
        mode: str | None = None,
        freezing: bool | None = None,
        *,
        fallback: bool = False,
        graph_stage: GraphBackend | None = None,
        cpp_wrapper: bool | None = None,
    ):
        super().__init__(device)
        self.mode = mode
        self.compiler = CompileBackend(
            device, mode=mode, freezing=freezing, cpp_wrapper=cpp_wrapper
        )
        self.fallback = fallback
        self.fallback_reason: str | None = None
        # The capture stage: a CUDA graph on CUDA, none on CPU (``graph_stage`` replaces it,
        # which is how the CPU tests drive the fallback path).
        self._graph = graph_stage
        if graph_stage is None and device.type == "cuda":
            self._graph = DeviceGraphBackend(device, "cudagraph")
        self.stages: tuple[str, ...] = (
            ("torchair reduce-overhead",)
            if device.type == "npu"
            else ("compile",) + ((self._graph.name,) if self._graph is not None else ())
        )

    @property
    def autotune(self) -> dict[str, Any] | None:
        return self.compiler.autotune

    @property
    def wrapper(self) -> str | None:
        """The compile stage's inductor wrapper ("cpp" / "python"; None before a capture)."""
        return self.compiler.wrapper

    @property
    def wrapper_fallback(self) -> str | None:
        """Why the compile stage fell back to inductor's Python wrapper (None: it did not)."""
        return self.compiler.wrapper_fallback

    @property
    def label(self) -> str:
        """What ran, for reports: ``fused (compile+cudagraph)``."""
        return f"{self.name} ({'+'.join(self.stages)})"

    def capture(self, fn: Callable[[], Any], *, warmup: int = 3) -> CapturedStep:
        if self.device.type == "npu":
            return self._capture_npu(fn, warmup)
        try:
            compiled = self.compiler.capture(fn, warmup=warmup)
        except CaptureFailedError as err:
            if not (self.fallback and self._graph is not None):
                raise
            self.fallback_reason = f"compile stage failed, captured the plain step: {err}"
            log.warning("fused backend: %s", self.fallback_reason)
            self.stages = (self._graph.name,)
            return self._graph.capture(fn, warmup=warmup)
        if self._graph is None:
            return _CompiledReplay(compiled)
        # The compiled step was traced and warmed by the compile stage; the graph stage
        # warms it once more on its side stream and records its kernels.
        assert isinstance(compiled, _CompiledStep)
        if not isinstance(self._graph, DeviceGraphBackend):  # a stand-in stage (CPU tests)
            _before_capture(compiled.compiled)
        return self._graph.capture(compiled.compiled, warmup=1)

    def _capture_npu(self, fn: Callable[[], Any], warmup: int) -> CapturedStep:
        """torchair compiles and captures (NPU graph) in one: its reduce-overhead mode."""
        from .npu_names import NPU

        try:
            config = NPU.resolve("torchair.CompilerConfig")()
            config.mode = "reduce-overhead"
            backend = NPU.resolve("torchair.get_npu_backend")(
                **NPU.kwargs("torchair.get_npu_backend", compiler_config=config)
            )
            compiled = torch.compile(
                _fresh_function(fn), backend=backend, fullgraph=True, dynamic=False
            )
            out = None
            for _ in range(max(1, warmup)):
                out = compiled()
            synchronize(self.device)
        except Exception as err:
            raise self._fail(err) from err
        return _CompiledStep(compiled, self.compiler, out)


def auto_backend_name(device_type: str) -> str:
    """What ``auto`` picks on a device type: npugraph on NPU, fused on CUDA, compile else.

    Takes the type as a string: on a machine without torch_npu ``torch.device("npu")``
    cannot even be built, and callers still ask what an NPU run would use.
    """
    return {"npu": "npugraph", "cuda": "fused"}.get(device_type, "compile")


def resolve_backend_name(backend: str, device: torch.device) -> str:
    """``auto`` -> npugraph on NPU, fused on CUDA, compile on CPU; checks the pairing."""
    if backend not in BACKENDS:
        raise PyptoCaptureError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return auto_backend_name(device.type)
    want = {"npugraph": "npu", "cudagraph": "cuda"}.get(backend)
    if want is not None and device.type != want:
        raise DeviceNotAvailableError(
            f"backend {backend!r} needs a {want} device but the device is {device}; "
            f"use backend='auto' or 'compile'"
        )
    return backend


def make_backend(
    backend: str = "auto", device: torch.device | str | None = None, **options: Any
) -> GraphBackend:
    """Build the backend object for ``backend`` on ``device`` (``None`` -> resolve 'auto')."""
    dev = resolve_device(device)
    name = resolve_backend_name(backend, dev)
    if name == "compile":
        return CompileBackend(
            dev,
            mode=options.get("compile_mode"),
            freezing=options.get("freezing"),
            cpp_wrapper=options.get("cpp_wrapper"),
        )
    if name == "fused":
        return FusedBackend(
            dev,
            mode=options.get("compile_mode"),
            freezing=options.get("freezing"),
            fallback=backend == "auto",
            cpp_wrapper=options.get("cpp_wrapper"),
        )
    if name == "eager":
        return EagerBackend(dev)
    return DeviceGraphBackend(dev, name)


@dataclass
class ReplayResult:
    """Output of the last replay and the wall time of *every* replay (not a mean)."""

    output: Any
    times_s: list[float] = field(default_factory=list)
    backend: str = ""
    capture_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "capture_s": self.capture_s, "times_s": list(self.times_s)}


def capture_and_replay(
    fn: Callable[[], Any],
    *,
    warmup: int = 3,
    replays: int = 10,
    backend: str | GraphBackend = "auto",
    device: torch.device | str | None = None,
) -> ReplayResult:
    """Capture the zero-argument ``fn`` and replay it ``replays`` times, timing each replay.

    ``fn`` must read its inputs from, and write its outputs to, tensors whose storage is
    fixed (that is what makes a replay meaningful). Each replay is timed between two device
    synchronisations, so the times are comparable across backends.
    """
    if replays < 1:
        raise PyptoCaptureError(f"replays must be >= 1, got {replays}")
    be = backend if isinstance(backend, GraphBackend) else make_backend(backend, device)
    t0 = time.perf_counter()
    step = be.capture(fn, warmup=warmup)
    synchronize(be.device)
    capture_s = time.perf_counter() - t0
    times: list[float] = []
    out = step.output
    for _ in range(replays):
        synchronize(be.device)
        t = time.perf_counter()
        out = step.replay()
        synchronize(be.device)
        times.append(time.perf_counter() - t)
    label = str(getattr(be, "label", be.name))  # a fused backend names its stages
    return ReplayResult(output=out, times_s=times, backend=label, capture_s=capture_s)
