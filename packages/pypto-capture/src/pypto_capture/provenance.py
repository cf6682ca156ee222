"""Where each kernel of a compiled step came from: inductor's provenance, as modules.

A compiled step runs generated kernels that no longer belong to one module, and a
profiler shows only their names: the step users ship is the one they cannot see inside.
While :func:`recording` is active, :class:`~pypto_capture.CompileBackend` (and the
compile stage of ``fused``) compiles through a thin wrapper around inductor's own entry
point (``compile_fx``, with the same mode options ``torch.compile(mode=...)`` applies)
that

- keeps the graph dynamo traced, whose nodes carry ``nn_module_stack`` (the module each
  operation ran in);
- turns on inductor's provenance tracking (``config.trace.provenance_tracking_level``,
  the mapping tlparse reads) and reads its structured-trace artifact
  ``inductor_provenance_tracking_node_mappings``: kernel -> post-grad nodes -> the
  dynamo graph's nodes, in the order the kernels were generated (the order they run);
- names every CPU kernel in the profiler (``cpp.enable_kernel_profile``; CUDA kernels
  are named already) and bypasses the FX graph cache (a cache hit generates no code, so
  it would record nothing).

Each kernel is then described by the modules its source nodes ran in
(:class:`KernelSource`); a kernel fused across modules keeps every module with its share
of the source nodes (the split rule :data:`SPLIT_RULE` states). Matching these to a
profile is the profiler's job (``pypto_tune``); this module only records what the
compiler did. Recording changes the generated code only by the kernels' profiler
ranges, and costs one uncached compile (:attr:`ProvenanceRecorder.compile_s`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SPLIT_RULE",
    "GraphProvenance",
    "KernelSource",
    "ProvenanceRecorder",
    "active_recorder",
    "build_graph",
    "module_path",
    "profiler_key",
    "provenance_support",
    "recorded_names",
    "recording",
]

log = logging.getLogger(__name__)

#: How a kernel fused from several modules' operations is charged to them.
SPLIT_RULE = (
    "a kernel fused across modules is charged to each module in proportion to the number "
    "of its source operations (dynamo graph nodes) that ran in that module, and marked "
    "fused_across; an extern kernel (a library call such as a matmul or SDPA) is charged to "
    "the node that calls it, not to the nodes fused into its inputs; a GEMM template with "
    "fused prologue / epilogue is charged to its matmul's module"
)
_ARTIFACT = "inductor_provenance_tracking_node_mappings"
_ACTIVE: contextvars.ContextVar[ProvenanceRecorder | None] = contextvars.ContextVar(
    "pypto_capture_provenance", default=None
)
_HANDLE = re.compile(r":\d+$")
_GRAPH_PREFIX = re.compile(r"^graph_\d+_")
_OPS_CALL = re.compile(r"^(?:torch\.ops\.)?([A-Za-z_][\w]*)\.([A-Za-z_][\w]*)(?:\.[A-Za-z_]\w*)?$")


@dataclass(frozen=True)
class KernelSource:
    """One kernel of a compiled graph, in call order.

    ``kernel`` is inductor's name for it (``cpp_fused_add_mean_0``,
    ``torch.ops.mkl._mkl_linear.default``, ``extern_kernels.mm``, ``triton_poi_fused_0``);
    ``key`` the name a profiler records it under, normalised (:func:`profiler_key`);
    ``modules`` each module its source nodes ran in (a path relative to the compiled
    function's root object, ``""`` for code outside every module) with its share.
    """

    kernel: str
    key: str
    modules: tuple[tuple[str, float], ...]
    nodes: int

    @property
    def fused_across(self) -> bool:
        return len(self.modules) > 1


@dataclass
class GraphProvenance:
    """The kernels of one compiled graph and the class of every module path named."""

    kernels: list[KernelSource]
    classes: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernels": [
                {
                    "kernel": k.kernel,
                    "key": k.key,
                    "modules": [list(m) for m in k.modules],
                    "nodes": k.nodes,
                }
                for k in self.kernels
            ],
            "classes": dict(self.classes),
        }


def profiler_key(name: str) -> str:
    """The name a profiler records a kernel under, normalised so both sides compare.

    ``graph_0_cpp_fused_x_1`` (inductor's profiler range) and ``cpp_fused_x_1`` are one
    kernel; ``torch.ops.mkl._mkl_linear.default`` is the operator ``mkl::_mkl_linear``;
    ``extern_kernels.mm`` is ``aten::mm``; ``aten::mm`` stays itself.
    """
    name = _HANDLE.sub("", name.strip())
    if "::" in name:
        return name
    name = _GRAPH_PREFIX.sub("", name)
    if name.startswith("extern_kernels."):
        return "aten::" + name.split(".", 1)[1]
    m = _OPS_CALL.match(name)
    if m and (name.startswith("torch.ops.") or m.group(1) == "aten"):
        return f"{m.group(1)}::{m.group(2)}"
    return name


_PATH_ROOT = re.compile(r"^(?:[LG]\[['\"][^'\"]*['\"]\]|self)")
_PATH_ITEM = re.compile(r"\._modules\[['\"]([^'\"]+)['\"]\]|\[['\"]([^'\"]+)['\"]\]|\[(\d+)\]")


def module_path(raw: str) -> str:
    """A dynamo ``nn_module_stack`` path as a dotted path below the traced root object.

    ``L['self'].model.layers[0].self_attn`` -> ``model.layers.0.self_attn``;
    ``G['m']._modules['lm_head']`` -> ``lm_head``; the root itself -> ``""``.
    """
    rest = _PATH_ROOT.sub("", raw.strip(), count=1)
    rest = _PATH_ITEM.sub(lambda m: "." + (m.group(1) or m.group(2) or m.group(3)), rest)
    return ".".join(p for p in rest.split(".") if p)


def _innermost(node: Any) -> tuple[str, str] | None:
    stack = node.meta.get("nn_module_stack") if hasattr(node, "meta") else None
    if not stack:
        return None
    raw, cls = list(stack.values())[-1]
    name = getattr(cls, "__name__", None) or str(cls).rsplit(".", 1)[-1].strip("'>")
    return module_path(str(raw)), str(name)


def provenance_support() -> str | None:
    """None when this torch records inductor provenance; else why not (one line)."""
    try:
        import torch._inductor.config as inductor_config
    except Exception as err:  # pragma: no cover - every supported torch has inductor
        return f"torch has no inductor ({type(err).__name__})"
    if not hasattr(inductor_config.trace, "provenance_tracking_level"):
        import torch

        return (
            f"torch {torch.__version__} has no inductor provenance tracking "
            "(config.trace.provenance_tracking_level, torch >= 2.9): the captured step "
            "is reported as one block"
        )
    return None


class _Artifacts(logging.Handler):
    """Collects inductor's provenance artifact from torch's structured trace log."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.mappings: list[dict[str, Any]] = []
        self.code: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "metadata", None)
        if not isinstance(meta, dict):
            return
        if "inductor_output_code" in meta:
            payload = getattr(record, "payload", None)
            if isinstance(payload, str):
                self.code.append(payload)
            return
        art = meta.get("artifact")
        if not (isinstance(art, dict) and art.get("name") == _ARTIFACT):
            return
        try:
            got = json.loads(getattr(record, "payload", "") or "{}")
        except ValueError:
            return
        if isinstance(got, dict):
            self.mappings.append(got)


def _code_to_post(mapping: dict[str, Any]) -> dict[str, list[str]]:
    for key, value in mapping.items():
        if key.endswith("CodeToPost") and isinstance(value, dict):
            return {str(k): [str(n) for n in v] for k, v in value.items() if isinstance(v, list)}
    return {}


#: Post-grad node names (inductor names a node after its operator) of matmul / attention.
_HEAVY = re.compile(
    r"(?:addmm|mm|bmm|baddbmm|_mkl_linear|_linear_pointwise|convolution|"
    r"_scaled_dot_product\w*?|_flash_attention\w*?|_efficient_attention\w*?)(?:_\d+)?"
)
_DEFINITION = re.compile(r"^(\w+) = async_compile\.\w+\(", re.M)
_RECORDED = re.compile(r'RAIIAtenRecordFunctionHandle\s+\w+\("([^"]+)"')


def recorded_names(code: str) -> dict[str, str]:
    """Kernel -> the profiler range its generated source opens, where that differs from
    its own name: a C++ GEMM template (``cpp_fused_addmm_1``) records its micro-kernel's
    name (``graph_0_gemm_m1n896k896_kernel``). Read from inductor's output code."""
    out: dict[str, str] = {}
    spans = [(m.group(1), m.start(), m.end()) for m in _DEFINITION.finditer(code)]
    for i, (name, _, start) in enumerate(spans):
        end = spans[i + 1][1] if i + 1 < len(spans) else len(code)
        m = _RECORDED.search(code, start, end)
        if m is None:
            continue
        key = profiler_key(m.group(1))
        if key != name:
            out[name] = key
    return out


def _extern_op(kernel: str) -> str | None:
    """The operator an extern kernel calls (``torch.ops.mkl._mkl_linear.default`` ->
    ``_mkl_linear``); None for generated kernels."""
    key = profiler_key(kernel)
    return key.split("::", 1)[1] if "::" in key else None


def build_graph(
    gm: Any, mapping: dict[str, Any], aliases: dict[str, str] | None = None
) -> GraphProvenance:
    """:class:`GraphProvenance` from the dynamo graph and inductor's provenance mapping
    (``aliases``: :func:`recorded_names` of the graph's output code)."""
    by_name: dict[str, tuple[str, str] | None] = {}
    for node in gm.graph.nodes:
        by_name[node.name] = _innermost(node)
    raw = mapping.get("postToPre")
    post_to_pre: dict[str, Any] = raw if isinstance(raw, dict) else {}
    code = _code_to_post(mapping)

    def handle(item: tuple[str, list[str]]) -> int:
        tail = item[0].rsplit(":", 1)
        return int(tail[1]) if len(tail) == 2 and tail[1].isascii() and tail[1].isdigit() else 0

    kernels: list[KernelSource] = []
    classes: dict[str, str] = {}
    claimed: set[str] = set()
    for kernel, posts in sorted(code.items(), key=handle):
        name = _HANDLE.sub("", kernel)
        op = _extern_op(name)
        if name in (aliases or {}):
            # A GEMM template with its prologue / epilogue fused in: the matmul is the
            # work (O(MNK) against their O(MN)), so its module is charged.
            # Its origins reach back through its inputs to earlier matmuls: the ones no
            # earlier kernel computed are its own.
            heavy = [p for p in posts if _HEAVY.fullmatch(p) and p not in claimed]
            claimed.update(heavy)
            posts = heavy or posts
        elif op is not None:
            # An extern kernel's recorded origins can include the nodes that feed it (and
            # earlier calls of the same operator): it is the first node of its own
            # operator that no earlier kernel called.
            pattern = re.escape(op) + r"(?:_\d+)?"
            own = [p for p in posts if re.fullmatch(pattern, p) and p not in claimed]
            if own:
                claimed.add(own[0])
                posts = own[:1]
        pres: list[str] = []
        for post in posts:
            for pre in post_to_pre.get(post, []) or []:
                if pre not in pres:
                    pres.append(str(pre))
        counts: dict[str, int] = {}
        for pre in pres:
            where = by_name.get(pre)
            if where is None:
                continue
            path, cls = where
            classes.setdefault(path, cls)
            counts[path] = counts.get(path, 0) + 1
        total = sum(counts.values())
        modules = tuple((p, c / total) for p, c in counts.items()) if total else (("", 1.0),)
        key = (aliases or {}).get(name) or profiler_key(name)
        kernels.append(KernelSource(kernel=name, key=key, modules=modules, nodes=len(pres)))
    return GraphProvenance(kernels=kernels, classes=classes)


class ProvenanceRecorder:
    """What :func:`recording` collected: one :class:`GraphProvenance` per compiled graph.

    ``unavailable`` says why nothing could be recorded (an older torch); ``compile_s`` is
    the time spent compiling under recording (the attribution pass's cost; the profiled
    step itself runs the same kernels, each inside one profiler range).
    """

    def __init__(self, reference: Callable[[Callable[[], Any]], Any] | None = None) -> None:
        self.graphs: list[GraphProvenance] = []
        self.compile_s = 0.0
        self.unavailable: str | None = provenance_support()
        self.errors: list[str] = []
        #: Called with the step just before a device graph captures it (after warmup):
        #: a profiler runs it once there to record the kernel sequence the replays will
        #: run, each kernel with its module (the replay itself shows only kernel names).
        self.reference = reference
        self.references: list[Any] = []

    def before_capture(self, fn: Callable[[], Any]) -> None:
        """Run ``reference`` on a step about to be captured; what it returns is kept in
        ``references`` (a failure is kept in ``errors``: recording never breaks a capture)."""
        if self.reference is None:
            return
        try:
            got = self.reference(fn)
        except Exception as err:
            self.errors.append(f"reference run failed: {type(err).__name__}: {err}")
            log.warning("reference run before capture failed: %s", err)
            return
        if got is not None:
            self.references.append(got)

    def backend(self, mode: str | None) -> Callable[..., Any]:
        """A ``torch.compile`` backend: inductor with ``mode``'s options, recorded."""

        def record(gm: Any, example_inputs: Any) -> Any:
            import torch._inductor.config as inductor_config
            from torch._inductor import list_mode_options
            from torch._inductor.compile_fx import compile_fx

            patches = dict(list_mode_options(mode, False)) if mode else {}
            handler = _Artifacts()
            trace_log = logging.getLogger("torch.__trace")
            extra: dict[str, Any] = {"cpp.enable_kernel_profile": True, "fx_graph_cache": False}
            if self.unavailable is None:
                extra["trace.provenance_tracking_level"] = 1
            started = time.perf_counter()
            trace_log.addHandler(handler)
            try:
                with inductor_config.patch(extra):
                    compiled = compile_fx(gm, example_inputs, config_patches=patches)
            finally:
                trace_log.removeHandler(handler)
                self.compile_s += time.perf_counter() - started
            if self.unavailable is None:
                try:
                    mapping = handler.mappings[-1] if handler.mappings else {}
                    aliases = recorded_names(handler.code[-1]) if handler.code else {}
                    graph = build_graph(gm, mapping, aliases)
                    if not graph.kernels:
                        self.errors.append("inductor recorded no kernel provenance for a graph")
                    self.graphs.append(graph)
                except Exception as err:  # recording must never break the capture
                    self.errors.append(f"provenance not read: {type(err).__name__}: {err}")
                    log.warning("provenance not read: %s", err)
            return compiled

        return record


def active_recorder() -> ProvenanceRecorder | None:
    """The recorder of the innermost active :func:`recording`, or None."""
    return _ACTIVE.get()


@contextlib.contextmanager
def recording(
    reference: Callable[[Callable[[], Any]], Any] | None = None,
) -> Iterator[ProvenanceRecorder]:
    """Record the provenance of every graph the compile backends compile inside, and
    (with ``reference``) what ``reference(step)`` returns for each step a device graph is
    about to capture."""
    rec = ProvenanceRecorder(reference)
    token = _ACTIVE.set(rec)
    try:
        yield rec
    finally:
        _ACTIVE.reset(token)
