"""The two layers of a profile: the raw trace any backend produces, and the summary.

Backends (``torch.profiler`` on CPU/CUDA, ``torch_npu.profiler`` on Ascend) differ in
what they record; each one converts its output into a :class:`RawTrace` (operators and
kernels with times, module scopes, step boundaries), and everything after that
(attribution, the per-step summary, detectors, advice, compare) reads only these
records. That is what keeps the NPU path from being a second implementation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = [
    "BLOCK_TYPES",
    "MODULE_SCOPE_PREFIX",
    "ROOT_SCOPE",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "STEP_MARKERS",
    "OpEvent",
    "OpStat",
    "Profile",
    "RawTrace",
    "Span",
    "block_of_module",
    "classify_module",
    "not_a_profile",
]

#: Version of the profile JSON; readers refuse a newer major version. 1.1: a graph
#: arm's operators carry their modules (``meta.attribution`` says how), operators of
#: kind ``host``.
SCHEMA_VERSION = "1.1"
SCHEMA_NAME = "pypto-tune.profile"

#: What a module does, for the time breakdown; "captured" is a fused graph whose
#: operators no longer belong to one module, "other" anything unrecognised.
BLOCK_TYPES = (
    "attention",
    "mlp",
    "experts",
    "norm",
    "rotary",
    "embedding",
    "lm_head",
    "other",
    "captured",
)

#: Prefix of the profiler ranges pypto-tune opens around each module's forward.
MODULE_SCOPE_PREFIX = "pypto_tune.module::"
#: Scope name of the profiled model's own forward (its class is in the classes map).
ROOT_SCOPE = "<model>"
#: Ranges that mark one step (the unit every figure is per).
STEP_MARKERS = ("pypto_tune.step", "pypto_capture::step")


@dataclass
class OpEvent:
    """One host operator or device kernel, as a backend reported it (times in us).

    ``self_us`` is host time not inside a child operator (None for kernels);
    ``device_us`` is device time of the kernels the operator launched (CUDA), or for a
    kernel event its own duration (on NPU the kernels carry the device time and their
    launching operator's ``device_us`` is None, its kernels' sum in ``extra["kernel_us"]``); ``core`` is the NPU accelerator core type
    (``AI_CORE``, ``AI_CPU``, ``AI_VECTOR_CORE``...) where the backend reports one.
    """

    name: str
    start_us: float
    dur_us: float
    self_us: float | None = None
    device_us: float | None = None
    # "op" | "kernel" | "sync" | "host" (host-side glue, not computation: a compiled
    # graph's wrapper code between its kernels once every kernel has its own range)
    kind: str = "op"
    thread: int = 0
    shapes: list[Any] | None = None
    dtypes: list[Any] | None = None
    core: str | None = None
    flops: float | None = None
    module: str | None = None
    top: bool = True  # False: called from inside another operator (not a leaf of the step)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass
class Span:
    """A named interval: a module's forward or one step."""

    name: str
    start_us: float
    end_us: float
    thread: int = 0

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass
class RawTrace:
    """What one profiled session recorded, backend-neutral."""

    events: list[OpEvent]
    modules: list[Span]
    steps: list[Span]
    device_type: str
    backend: str
    extra: dict[str, Any] = field(default_factory=dict)
    #: Writes the profiler's own trace (torch.profiler's Chrome trace) to a path and returns
    #: it; None where the backend keeps its own files (the NPU profiler's folder).
    native_export: Callable[[Path], Path] | None = field(default=None, repr=False, compare=False)


_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|block|decoder_layers)\.(\d+)(?:\.|$)")

# Module class-name / attribute-name patterns, checked in order (first match wins).
_BLOCK_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("rotary", re.compile(r"rotary|rope", re.I)),
    ("norm", re.compile(r"norm", re.I)),
    ("experts", re.compile(r"expert|moe|router|gate$", re.I)),
    ("attention", re.compile(r"attn|attention|self_attn|indexer", re.I)),
    ("mlp", re.compile(r"mlp|feed_?forward|ffn", re.I)),
    ("embedding", re.compile(r"embed|wte|wpe", re.I)),
    ("lm_head", re.compile(r"lm_head|output_layer|classifier", re.I)),
)


def classify_module(qualname: str, class_name: str = "") -> tuple[str, int | None]:
    """(block type, layer index or None) of a module from its qualified and class name.

    The innermost recognisable part decides: ``model.layers.3.self_attn.q_proj`` is
    attention in layer 3, ``model.layers.3.mlp.experts`` experts, ``model.norm`` norm.
    """
    m = _LAYER.search(qualname)
    layer = int(m.group(1)) if m else None
    parts = [class_name, *reversed(qualname.split("."))] if qualname else [class_name]
    for part in parts:
        if not part:
            continue
        for block, pattern in _BLOCK_RULES:
            if pattern.search(part):
                return block, layer
    return "other", layer


def block_of_module(
    module: str | None, classes: dict[str, str] | None = None
) -> tuple[str, int | None]:
    """Block and layer for an attributed module (None: outside every module: "other")."""
    if not module or module == ROOT_SCOPE:
        return "other", None
    # The innermost scope's class name is the strongest signal; fall back to its path.
    path = module
    while path:
        block, layer = classify_module(path, (classes or {}).get(path, ""))
        if block != "other":
            return block, layer
        if "." not in path:
            break
        path = path.rsplit(".", 1)[0]
    return classify_module(module, "")


@dataclass
class OpStat:
    """One operator at one place in the model, per step (means over the profiled steps)."""

    name: str
    module: str | None
    block: str
    layer: int | None
    calls: float
    host_us: float
    self_us: float
    device_us: float
    kind: str = "op"
    core: str | None = None
    shapes: list[Any] | None = None
    dtypes: list[Any] | None = None
    flops: float | None = None
    bytes: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Profile:
    """The summary every later stage reads; ``to_dict`` is the versioned JSON."""

    meta: dict[str, Any]
    peaks: dict[str, Any]
    step: dict[str, Any]
    ops: list[OpStat]
    blocks: dict[str, dict[str, float]]
    call_graph: list[dict[str, Any]]
    counters: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    microbench: dict[str, Any] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    trace: RawTrace | None = None  # kept in memory for the Chrome trace; not serialised

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_NAME,
            "schema_version": SCHEMA_VERSION,
            "meta": self.meta,
            "peaks": self.peaks,
            "step": self.step,
            "blocks": self.blocks,
            "ops": [o.to_dict() for o in self.ops],
            "call_graph": self.call_graph,
            "counters": self.counters,
            "memory": self.memory,
            "microbench": self.microbench,
            "findings": self.findings,
            "recommendations": self.recommendations,
            "warnings": self.warnings,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        # Fields a newer minor version adds are not ours to read: keep the known ones.
        known = {f.name for f in fields(OpStat)}
        ops = [OpStat(**{k: v for k, v in o.items() if k in known}) for o in data.get("ops", [])]
        return cls(
            meta=dict(data.get("meta", {})),
            peaks=dict(data.get("peaks", {})),
            step=dict(data.get("step", {})),
            ops=ops,
            blocks=dict(data.get("blocks", {})),
            call_graph=list(data.get("call_graph", [])),
            counters=dict(data.get("counters", {})),
            memory=dict(data.get("memory", {})),
            microbench=dict(data.get("microbench", {})),
            findings=list(data.get("findings", [])),
            recommendations=list(data.get("recommendations", [])),
            warnings=list(data.get("warnings", [])),
        )

    @property
    def step_us(self) -> float:
        return float(self.step.get("time_us", {}).get("mean") or 0.0)


def not_a_profile(function: str, name: str, value: object) -> str:
    """The TypeError message for a library call given something that is not a Profile."""
    hint = ""
    if hasattr(value, "trace") and hasattr(value, "level"):
        hint = " (a `with profile(...)` result: profile(model=...) yields a Profile)"
    return (
        f"{function}() takes a pypto_tune.Profile as {name}, got {type(value).__name__}{hint}: "
        "pass what profile_model(), profile_step(), load_profile() or "
        "`with pypto_tune.profile(model=m) as got` return"
    )
