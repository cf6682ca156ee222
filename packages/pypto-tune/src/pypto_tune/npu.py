"""The Ascend NPU path: record with ``torch_npu.profiler``, read its output into a RawTrace.

Everything downstream (attribution, summary, detectors) reads only :class:`RawTrace`, so
this module's job is to turn the profiler's ``*_ascend_pt/ASCEND_PROFILER_OUTPUT`` files
into the same records the CPU/CUDA backend produces. Every torch_npu name we touch is
declared once in :data:`NPU_API` and reached through :func:`_api`, so a checker can
verify the table against each released wheel instead of grepping call sites.

The profiler folder is treated as untrusted input (it may come from another machine):
files are size-capped, symlinks may not leave the folder, and nothing in it is executed.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from bisect import bisect_right
from pathlib import Path
from typing import Any

from pypto_common import (
    UntrustedFileError,
    atomic_write_text,
    known_secrets,
    loads_bounded,
    read_regular_file,
    redact,
    redact_argv,
)
from pypto_common.npu_api import NpuApi, NpuName, parse_table

from .errors import BadInputError, EnvironmentMissingError, OutputWriteError, ProfileFormatError
from .records import MODULE_SCOPE_PREFIX, STEP_MARKERS, OpEvent, RawTrace, Span

__all__ = [
    "ADVISOR_INPUTS",
    "ADVISOR_SOURCE",
    "AOE_DOC",
    "LEVELS",
    "MAX_FILE_BYTES",
    "NPU_API",
    "NpuProfilerSession",
    "advisor_inputs",
    "aoe_command",
    "operator_tuning_config",
    "parse_advisor_table",
    "read_ascend_output",
    "run_msprof_advisor",
    "runs_in",
]

log = logging.getLogger(__name__)


# kind path [keywords; "?" = optional] | where it was checked. P: Ascend/pytorch
# torch_npu/profiler/ (master and v2.x branches); H: hiascend.com torch_npu API reference.
_TABLE = """
module   torch_npu                                        | Ascend/pytorch torch_npu/__init__.py
module   torch_npu.profiler                               | P __init__.py
class    torch_npu.profiler.profile                       | P profiler.py class profile
kwarg    torch_npu.profiler.profile activities on_trace_ready record_shapes profile_memory
         with_stack experimental_config                   | P profiler.py profile.__init__
method   torch_npu.profiler.profile.start                 | P profiler.py profile.start
method   torch_npu.profiler.profile.stop                  | P profiler.py profile.stop
class    torch_npu.profiler.ProfilerActivity              | P __init__.py (torch_npu._C._profiler)
member   torch_npu.profiler.ProfilerActivity.CPU          | H torch_npu.profiler.profile
member   torch_npu.profiler.ProfilerActivity.NPU          | H torch_npu.profiler.profile
function torch_npu.profiler.tensorboard_trace_handler     | P profiler.py tensorboard_trace_handler
kwarg    torch_npu.profiler.tensorboard_trace_handler dir_name | P profiler.py
class    torch_npu.profiler._ExperimentalConfig           | P experimental_config.py
kwarg    torch_npu.profiler._ExperimentalConfig profiler_level aic_metrics data_simplification
         export_type?                                     | P experimental_config.py __init__
member   torch_npu.profiler.ProfilerLevel.Level0          | P experimental_config.py ProfilerLevel
member   torch_npu.profiler.ProfilerLevel.Level1          | P experimental_config.py ProfilerLevel
member   torch_npu.profiler.AiCMetrics.PipeUtilization    | P experimental_config.py AiCMetrics
member   torch_npu.profiler.AiCMetrics.AiCoreNone         | P experimental_config.py AiCMetrics
member?  torch_npu.profiler.ExportType.Text               | P experimental_config.py ExportType
function torch_npu.profiler.profiler.analyse              | P profiler.py analyse (named in errors)
function torch_npu.npu.set_aoe                            | H torch_npu.npu.set_aoe (AOE README)
"""


_PREFIX = {"P": "Ascend/pytorch torch_npu/profiler/", "H": "hiascend torch_npu API reference: "}


def _rows(table: str) -> tuple[NpuName, ...]:
    return parse_table(table, _PREFIX)


#: Every torch_npu name used here; code reaches torch_npu only through :func:`_api`.
NPU_API: tuple[NpuName, ...] = _rows(_TABLE)
_NPU = NpuApi(NPU_API, owner="pypto_tune.npu")


def _api(path: str) -> Any:
    """The torch_npu object at dotted ``path``; only names declared in NPU_API resolve.

    Returns None for a missing ``optional`` row; raises for anything else missing.
    """
    if not _NPU.declared(path):
        raise KeyError(f"{path} is not declared in pypto_tune.npu.NPU_API")
    return _NPU.resolve(path)


def _kwargs(path: str, **given: Any) -> dict[str, Any]:
    """``given`` after checking each keyword is declared for ``path`` in NPU_API."""
    declared = {r.kwarg for r in NPU_API if r.kind == "kwarg" and r.path == path}
    unknown = set(given) - declared
    if unknown:
        raise KeyError(f"keywords {sorted(unknown)} of {path} are not declared in NPU_API")
    return _NPU.kwargs(path, **given)


# ----------------------------------------------------------------------------- session

LEVELS = ("light", "detail")
_OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"


class NpuProfilerSession:
    """``with session:`` records everything in the block with torch_npu.profiler.

    ``light`` is Level0 (operator and kernel timings, no shapes: lowest overhead);
    ``detail`` is Level1 with the PipeUtilization AI Core metrics, shapes, memory and
    stacks (what the detectors need to say *why* a kernel is slow). The output is parsed
    by torch_npu when the block ends, into ``out_dir/<worker>_<ts>_ascend_pt``.
    """

    def __init__(self, level: str, out_dir: Path | str) -> None:
        if level not in LEVELS:
            raise BadInputError(
                f"unknown profiling level {level!r}; use one of {', '.join(LEVELS)}"
            )
        self.level = level
        self.out_dir = Path(out_dir)
        self._prof: Any = None
        self._before: set[str] = set()

    @staticmethod
    def _check_environment() -> None:
        try:
            _api("torch_npu")
            from pypto_capture import npu_available

            ok = npu_available()
        except Exception as exc:  # ImportError, or CANN libraries missing
            raise EnvironmentMissingError(
                f"torch_npu is not importable here ({type(exc).__name__}); install the torch_npu "
                "matching torch and CANN and source CANN's set_env.sh, or profile on cpu/cuda"
            ) from None
        if not ok:
            raise EnvironmentMissingError(
                "torch_npu imports but sees no Ascend NPU; check npu-smi and "
                "ASCEND_RT_VISIBLE_DEVICES, or profile on cpu/cuda"
            )

    def _build(self) -> Any:
        detail = self.level == "detail"
        cfg_path = "torch_npu.profiler._ExperimentalConfig"
        level = "torch_npu.profiler.ProfilerLevel." + ("Level1" if detail else "Level0")
        metrics = "torch_npu.profiler.AiCMetrics." + ("PipeUtilization" if detail else "AiCoreNone")
        cfg_kw = _kwargs(cfg_path, profiler_level=_api(level), aic_metrics=_api(metrics),
                         data_simplification=True)  # fmt: skip
        text = _api("torch_npu.profiler.ExportType.Text")
        if text is not None:
            cfg_kw.update(_kwargs(cfg_path, export_type=text))
        activity = "torch_npu.profiler.ProfilerActivity."
        handler = "torch_npu.profiler.tensorboard_trace_handler"
        on_ready = _api(handler)(**_kwargs(handler, dir_name=str(self.out_dir)))
        kwargs = _kwargs(
            "torch_npu.profiler.profile",
            activities=[_api(activity + "CPU"), _api(activity + "NPU")],
            on_trace_ready=on_ready,
            record_shapes=detail,
            profile_memory=detail,
            with_stack=detail,
            experimental_config=_api(cfg_path)(**cfg_kw),
        )
        return _api("torch_npu.profiler.profile")(**kwargs)

    def __enter__(self) -> NpuProfilerSession:
        self._check_environment()  # before touching the disk
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.snapshot()
        try:
            self._prof = self._build()
        except AttributeError as exc:  # a name NPU_API lists is missing from this wheel
            raise EnvironmentMissingError(
                f"{exc}; install torch_npu >= 2.5.1 matching torch"
            ) from None
        self._prof.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # Stop even when the block raised: the profiler holds device buffers until then.
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.stop()

    def snapshot(self) -> set[str]:
        """Note the ``*_ascend_pt`` runs already in ``out_dir`` (called on entering), so
        :meth:`trace` reads the run this session recorded, never an older one."""
        self._before = {p.name for p in runs_in(self.out_dir)}
        return set(self._before)

    def trace(self) -> RawTrace:
        """The RawTrace of the ``*_ascend_pt`` folder this session wrote into ``out_dir``:
        one not there when it started (:meth:`snapshot`), the newest if several are."""
        before: set[str] = getattr(self, "_before", set())
        found = [p for p in runs_in(self.out_dir) if p.name not in before]
        if not found:
            older = f" (only older runs: {', '.join(sorted(before))[:120]})" if before else ""
            raise ProfileFormatError(
                f"no new *_ascend_pt folder under {self.out_dir}{older}: torch_npu.profiler "
                "wrote nothing; check the plog (~/ascend/log) and that the profiled block ran "
                "on the NPU"
            )

        def age(p: Path) -> tuple[float, str]:
            try:
                return (p.stat().st_mtime, p.name)
            except OSError:
                return (0.0, p.name)

        return read_ascend_output(max(found, key=age))


def runs_in(folder: Path) -> list[Path]:
    """The ``*_ascend_pt`` run folders directly in ``folder`` (links are not runs)."""
    try:
        entries = list(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        return []
    return [p for p in entries
            if p.name.endswith("_ascend_pt") and not p.is_symlink() and p.is_dir()]  # fmt: skip


# ----------------------------------------------------------------------------- reading

#: Largest file read from a profiler folder (a real step's trace_view.json is tens of MB).
MAX_FILE_BYTES = 256 * 1024 * 1024

_HOST_CATS = ("cpu_op", "user_annotation")
_CORES = {
    "AICORE": "AI_CORE",
    "AICPU": "AI_CPU",
    "AIV": "AI_VECTOR_CORE",
    "AIVECTOR": "AI_VECTOR_CORE",
}
_DTYPES = {
    "BF16": "bf16", "BFLOAT16": "bf16", "FLOAT16": "fp16", "FP16": "fp16", "HALF": "fp16",
    "FLOAT": "fp32", "FLOAT32": "fp32", "FP32": "fp32", "DOUBLE": "fp64", "FLOAT64": "fp64",
}  # fmt: skip


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Folder:
    """Reads files of one profiler folder without leaving it or reading too much."""

    def __init__(self, folder: Path | str, max_bytes: int) -> None:
        given = Path(folder)
        if not given.is_dir():
            raise BadInputError(
                f"{given} is not a folder; pass a *_ascend_pt folder or its {_OUTPUT_DIR}"
            )
        self.root = _resolve(given, f"{given}: is a symlink loop; pass the real folder")
        self.max_bytes = max_bytes
        out = self.root if self.root.name == _OUTPUT_DIR else self.root / _OUTPUT_DIR
        if not os.path.lexists(out):
            raise ProfileFormatError(
                f"{self.root}: no {_OUTPUT_DIR} folder (torch_npu's parsing did not run); run "
                f"torch_npu.profiler.profiler.analyse('{self.root}') where it was recorded"
            )
        real = _resolve(out, f"{_OUTPUT_DIR}: is a symlink loop (in {self.root}); not read")
        if not real.is_relative_to(self.root):
            raise ProfileFormatError(f"{_OUTPUT_DIR}: is a link leaving {self.root}; not read")
        if not real.is_dir():
            raise ProfileFormatError(
                f"{_OUTPUT_DIR}: is not a folder (in {self.root}); not torch_npu's output"
            )
        self.out = out

    def fail(self, name: str, problem: str) -> ProfileFormatError:
        rel = name if self.out == self.root else f"{_OUTPUT_DIR}/{name}"
        return ProfileFormatError(f"{rel}: {_one_line(problem)} (in {self.root})")

    def read(self, name: str) -> str | None:
        path = self.out / name
        if not os.path.lexists(path):
            return None
        try:
            real = path.resolve()
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
            raise self.fail(name, "is a symlink loop; not read") from None
        if not real.is_relative_to(self.root):
            raise self.fail(name, "is a symlink pointing outside the profile folder; not read")
        try:
            data = read_regular_file(real, self.max_bytes)
        except UntrustedFileError as exc:
            cap = "; profile fewer steps" if "limit" in str(exc) else ""
            raise self.fail(name, f"{exc}{cap}".replace("limit", "cap")) from None
        except OSError as exc:
            raise self.fail(name, f"cannot be opened ({exc.strerror or exc})") from None
        try:
            return data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise self.fail(name, f"is not UTF-8 text (byte {exc.start})") from None

    def rows(self, name: str, required: tuple[str, ...]) -> list[dict[str, str]] | None:
        """CSV rows as dicts; every row must have exactly the header's number of fields."""
        text = self.read(name)
        if text is None:
            return None
        reader = csv.reader(io.StringIO(text, newline=""))
        try:
            header = [h.strip() for h in next(reader, [])]
            missing = [c for c in required if c not in header]
            if not header or missing:
                raise self.fail(name, f"header lacks {missing or list(required)}; not torch_npu's")
            rows = []
            for row in reader:
                if not row:
                    continue
                if len(row) != len(header):
                    n = reader.line_num
                    raise self.fail(
                        name, f"line {n} has {len(row)} fields, the header {len(header)}"
                    )
                rows.append({h: v.strip() for h, v in zip(header, row, strict=True)})
        except csv.Error as exc:
            raise self.fail(name, f"line {reader.line_num}: {exc}") from None
        return rows


def _num(value: Any) -> float | None:
    """A finite float from a number or numeric string (torch_npu writes both), else None."""
    if isinstance(value, bool):
        return None
    try:
        out = float(str(value).strip().strip('"'))
    except ValueError:
        return None
    return out if math.isfinite(out) else None


def _num_or_text(value: str) -> Any:
    return value if (num := _num(value)) is None else num


def _args(ev: dict[str, Any]) -> dict[str, Any]:
    return ev["args"] if isinstance(ev.get("args"), dict) else {}


def _tid(value: Any) -> int:
    if type(value) is int:
        return value
    text = str(value) if isinstance(value, (str, float)) else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else 0


def _resolve(path: Path, problem: str) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        raise ProfileFormatError(problem) from None


def _need(folder: _Folder, name: str, value: Any, what: str) -> float:
    out = _num(value)
    if out is None:
        raise folder.fail(name, f"{what} is {_one_line(repr(value), 40)}, not a number")
    return out


def _core(value: str | None) -> str | None:
    """Accelerator core in the upper-case names detectors compare with (AI_CORE, AI_CPU...)."""
    if not value or value.upper() in ("N/A", "NA"):
        return None
    key = re.sub(r"[\s-]+", "_", value.strip().upper())
    return _CORES.get(key.replace("_", ""), _CORES.get(key, key))


_DIM = re.compile(r"-?[0-9]{1,18}")


def _per_tensor(text: str, dtype: bool = False) -> list[Any] | None:
    """``"1,4096;4096,11008"`` -> [[1, 4096], [4096, 11008]]; ``"DT_BF16;INT64"`` -> bf16, int64."""
    text = text.strip().strip('"')
    if not text or text.upper() == "N/A":
        return None
    if dtype:
        keys = [t.strip().upper().removeprefix("DT_") for t in text.split(";")]
        return [_DTYPES.get(k, k.lower()) for k in keys]
    dims = ([d.strip() for d in t.split(",") if d.strip()] for t in text.split(";"))
    return [[int(d) if _DIM.fullmatch(d) else d for d in ds] for ds in dims]


def _events(folder: _Folder) -> list[dict[str, Any]]:
    name = "trace_view.json"
    text = folder.read(name)
    if text is None:
        raise folder.fail(name, "is missing; the profile was not parsed (or was exported as db)")
    try:
        data = loads_bounded(text)
    except UntrustedFileError as exc:
        raise folder.fail(name, f"is not valid JSON ({exc})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise folder.fail(name, "is not a Chrome trace (a list of events or {traceEvents: [...]})")
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise folder.fail(name, f"event #{i} is not an object; not a Chrome trace")
        for key in ("pid", "tid", "id"):  # keys of the lookups below: a list cannot be one
            if isinstance(ev.get(key), (list, dict)):
                kind = type(ev[key]).__name__
                raise folder.fail(name, f"event #{i} has a {kind} as {key}; not a Chrome trace")
    return events


def read_ascend_output(folder: Path | str, *, max_bytes: int = MAX_FILE_BYTES) -> RawTrace:
    """Read a ``*_ascend_pt`` folder (or its ASCEND_PROFILER_OUTPUT) into a RawTrace.

    Host operators, module scopes (``pypto_tune.module::<qualname>`` ranges) and steps
    come from trace_view.json; kernels from kernel_details.csv (from the trace's
    "Ascend Hardware" rows when that file is absent), on the device timeline (their
    own start and duration, ``thread`` -1, ``device_us`` = duration), so device busy
    time stays true. A kernel reached by an ``async_npu`` flow gets the ``module`` of
    the host operator that launched it: the innermost module scope open on that
    operator's thread when it started (``extra``: ``launched_by``, ``launch_us``); the
    operator's ``extra["kernel_us"]`` sums its kernels, and its ``device_us`` stays None
    so a step's device time is not counted twice. A kernel without a flow (replayed
    inside a captured graph, or the profiler lost the link) keeps ``module`` None and
    ``extra["linked"] = False``: only its device time and step are known.
    """
    fold = _Folder(folder, max_bytes)
    events = _events(fold)
    tname = "trace_view.json"
    proc_names: dict[Any, str] = {}
    for ev in events:
        if ev.get("ph") == "M" and ev.get("name") == "process_name" and _args(ev):
            proc_names[ev.get("pid")] = str(ev["args"].get("name", ""))
    hw_pids = {pid for pid, n in proc_names.items() if "Ascend Hardware" in n}
    py_pids = {pid for pid, n in proc_names.items() if n == "Python"}

    ops: list[OpEvent] = []
    op_pid: list[Any] = []
    modules: list[Span] = []
    steps: list[Span] = []
    hw: list[dict[str, Any]] = []
    flows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for i, ev in enumerate(events):
        ph, cat = ev.get("ph"), ev.get("cat")
        if cat == "async_npu" and ph in ("s", "f"):
            flows.setdefault(str(ev.get("id")), {"s": [], "f": []})[ph].append(ev)
            continue
        if ph != "X":
            continue
        name = ev.get("name")
        if not isinstance(name, str):
            raise fold.fail(tname, f"event #{i} has no name")
        ts = _need(fold, tname, ev.get("ts"), f"event #{i} ({name}) ts")
        dur = _need(fold, tname, ev.get("dur", 0), f"event #{i} ({name}) dur")
        if ev.get("pid") in hw_pids:
            where = {"pid": ev.get("pid"), "tid": ev.get("tid"), "args": _args(ev)}
            hw.append({"name": name, "ts": ts, "dur": dur, **where})
            continue
        if not (cat in _HOST_CATS or (cat is None and ev.get("pid") in py_pids)):
            continue
        tid = _tid(ev.get("tid"))
        if name.startswith(MODULE_SCOPE_PREFIX):
            modules.append(Span(name[len(MODULE_SCOPE_PREFIX) :], ts, ts + dur, tid))
        elif name in STEP_MARKERS:
            steps.append(Span(name, ts, ts + dur, tid))
        elif not name.startswith("ProfilerStep#"):
            dims, types = _args(ev).get("Input Dims"), _args(ev).get("Input type")
            ops.append(OpEvent(name, ts, dur, kind="op", thread=tid,
                               shapes=dims if isinstance(dims, list) else None,
                               dtypes=types if isinstance(types, list) else None))  # fmt: skip
            op_pid.append(ev.get("pid"))

    # Self time and nesting, per host thread.
    by_thread: dict[tuple[Any, int], list[int]] = {}
    for idx, op in enumerate(ops):
        by_thread.setdefault((op_pid[idx], op.thread), []).append(idx)
    for idxs in by_thread.values():
        idxs.sort(key=lambda k: (ops[k].start_us, -ops[k].dur_us))
        stack: list[int] = []
        child: dict[int, float] = {}
        for k in idxs:
            while stack and ops[stack[-1]].end_us < ops[k].end_us - 1e-6:
                stack.pop()
            if stack and ops[stack[-1]].start_us <= ops[k].start_us:
                ops[k].top = False
                child[stack[-1]] = child.get(stack[-1], 0.0) + ops[k].dur_us
            stack.append(k)
        for k in idxs:
            ops[k].self_us = max(ops[k].dur_us - child.get(k, 0.0), 0.0)

    # async_npu flows: device (rounded ts) -> launching host op (innermost op at the flow start).
    starts = {key: [ops[k].start_us for k in idxs] for key, idxs in by_thread.items()}
    launch: dict[float, list[tuple[str | None, int]]] = {}
    hw_name = {(h["pid"], h["tid"], round(h["ts"], 3)): h["name"] for h in hw}
    # zip: older torch_npu keys a flow by its kernel's start, so ids may repeat.
    for s, f in (sf for pair in flows.values() for sf in zip(pair["s"], pair["f"], strict=False)):
        s_ts = _need(fold, tname, s.get("ts"), "async_npu flow start ts")
        f_ts = _need(fold, tname, f.get("ts"), "async_npu flow end ts")
        key = (s.get("pid"), _tid(s.get("tid")))
        idxs = by_thread.get(key, [])
        pos = bisect_right(starts.get(key, []), s_ts + 1e-6) - 1
        back = range(pos, max(pos - 256, -1), -1)
        op_idx = next((idxs[j] for j in back if ops[idxs[j]].end_us >= s_ts - 1e-6), None)
        if op_idx is not None:
            dev = hw_name.get((f.get("pid"), f.get("tid"), round(f_ts, 3)))
            launch.setdefault(round(f_ts, 3), []).append((dev, op_idx))

    kernels, source, extra = _kernels(fold, hw)
    mods: dict[int, list[Span]] = {}
    for span in modules:
        mods.setdefault(span.thread, []).append(span)
    for spans in mods.values():
        spans.sort(key=lambda m: (m.start_us, -m.end_us))
    mod_starts = {t: [m.start_us for m in spans] for t, spans in mods.items()}

    def module_at(thread: int, t: float) -> str | None:
        """The innermost module scope open at host time ``t`` on ``thread``."""
        spans = mods.get(thread, [])
        pos = bisect_right(mod_starts.get(thread, []), t) - 1
        return next((spans[j].name for j in range(pos, max(pos - 512, -1), -1)
                     if spans[j].end_us > t), None)  # fmt: skip

    linked = 0
    for kern in kernels:
        cands = launch.get(round(kern.start_us, 3), [])
        first = cands[0][1] if cands else None
        match = next((h for d, h in cands if d == kern.extra["kernel_name"]), first)
        kern.extra["linked"] = match is not None
        if match is None:
            continue
        linked += 1
        host = ops[match]
        kern.module = module_at(host.thread, host.start_us)
        kern.extra.update(launched_by=host.name, launch_us=host.start_us)
        host.extra["kernel_us"] = host.extra.get("kernel_us", 0.0) + (kern.device_us or 0.0)
    if kernels and linked < len(kernels):
        log.info("%d of %d NPU kernels have no async_npu flow; left without a module",
                 len(kernels) - linked, len(kernels))  # fmt: skip
    extra.update(folder=str(fold.root), kernel_source=source, kernels_linked=linked,
                 kernels_unlinked=len(kernels) - linked)  # fmt: skip
    return RawTrace(
        events=sorted(ops + kernels, key=lambda e: (e.start_us, e.kind != "op")),
        modules=sorted(modules, key=lambda s: s.start_us),
        steps=sorted(steps, key=lambda s: s.start_us),
        device_type="npu",
        backend="torch_npu.profiler",
        extra=extra,
    )


def _kernels(fold: _Folder, hw: list[dict[str, Any]]) -> tuple[list[OpEvent], str, dict[str, Any]]:
    """Kernel OpEvents on the device timeline, plus the op_statistic / step_trace_time tables."""
    extra: dict[str, Any] = {}
    for name, key, need in (("op_statistic.csv", "op_statistic", ("OP Type", "Count")),
                            ("step_trace_time.csv", "step_trace_time", ("Step",))):  # fmt: skip
        rows = fold.rows(name, need)
        if rows is not None:
            extra[key] = [{k: _num_or_text(v) for k, v in r.items()} for r in rows]
            for r in extra[key]:
                if "Core Type" in r:
                    r["Core Type"] = _core(str(r["Core Type"]))
    kname = "kernel_details.csv"
    rows = fold.rows(kname, ("Name", "Start Time(us)", "Duration(us)"))
    out: list[OpEvent] = []
    if rows is None:
        for h in hw:
            core = _core(str(h["args"].get("Task Type", "")))
            out.append(OpEvent(h["name"], h["ts"], h["dur"], device_us=h["dur"], kind="kernel",
                               thread=-1, core=core, top=False,
                               extra={"kernel_name": h["name"]}))  # fmt: skip
        return out, "trace_view.json", extra
    skip = {"Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)", "Input Shapes",
            "Input Data Types", "Output Shapes"}  # fmt: skip
    for line, row in enumerate(rows, start=2):
        start = _need(fold, kname, row["Start Time(us)"], f"line {line} Start Time(us)")
        dur = _need(fold, kname, row["Duration(us)"], f"line {line} Duration(us)")
        kx: dict[str, Any] = {"kernel_name": row["Name"], "type": row.get("Type") or None}
        if row.get("Output Shapes"):
            kx["output_shapes"] = _per_tensor(row["Output Shapes"])
        for col, val in row.items():
            if col in skip:
                continue
            key = re.sub(r"\W+", "_", col.lower().replace("(us)", "_us")).strip("_")
            kx[key] = _num_or_text(val)
        shapes = _per_tensor(row.get("Input Shapes", ""))
        dtypes = _per_tensor(row.get("Input Data Types", ""), dtype=True)
        out.append(OpEvent(row.get("Type") or row["Name"], start, dur, device_us=dur, kind="kernel",
                           thread=-1, core=_core(row.get("Accelerator Core")), top=False,
                           shapes=shapes, dtypes=dtypes, extra=kx))  # fmt: skip
    return out, kname, extra


# ----------------------------------------------------------------------------- AOE

_OP_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
_OP_NAME = re.compile(r"[A-Za-z0-9_./-]{1,512}")
AOE_DOC = (
    "https://www.hiascend.com/document/detail/en/canncommercial/800/devaids/aoe/aoerc_16_0061.html"
)


def _ok(pattern: re.Pattern[str], value: Any) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def _int_lists(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, list) and all(type(d) is int for d in t) for t in value
    )


def aoe_command(config: Path | str, dump_dir: Path | str) -> str:
    """The shell line that runs AOE operator tuning (job type 2) on the flagged operators."""
    return (
        f"aoe --job_type=2 --model_path={shlex.quote(str(dump_dir))} "
        f"--tune_ops_file={shlex.quote(str(config))}"
    )


def operator_tuning_config(
    flagged: list[dict[str, Any]], path: Path | str, *, dump_dir: Path | str = "aoe_dump"
) -> Path:
    """Write AOE's ``--tune_ops_file`` for the flagged operators, and a README beside it.

    The file is the JSON AOE documents ({"tune_ops_type": [...], "tune_ops_name": [...]},
    see AOE_DOC), which cannot hold comments, so the command and the flagged shapes go
    to ``<stem>.README.txt``. Items are {"name": op type, "shapes", "dtype"} and may add
    "op_name" (an exact graph op name). Both files are written atomically, after every
    item was checked, so a bad item leaves nothing on disk.
    """
    target = Path(path)
    if not isinstance(flagged, list) or not flagged:
        raise BadInputError("no flagged operators to tune; pass at least one {'name': 'MatMulV2'}")
    if not target.parent.is_dir() or target.is_dir():
        raise BadInputError(f"{target} is not a writable file path; create {target.parent} first")
    types: list[str] = []
    names: list[str] = []
    lines: list[str] = []
    for i, item in enumerate(flagged):
        item = item if isinstance(item, dict) else {}
        op_type, op_name = item.get("type") or item.get("name"), item.get("op_name")
        shapes, dtype = item.get("shapes"), item.get("dtype")
        checks = (
            (not _ok(_OP_TYPE, op_type), "name must be an operator type like 'MatMulV2'"),
            (op_name is not None and not _ok(_OP_NAME, op_name), "op_name: A-Za-z0-9_./- only"),
            (shapes is not None and not _int_lists(shapes), "shapes must be lists of integers"),
            (dtype is not None and not _ok(_OP_TYPE, dtype), "dtype must be a name like 'bf16'"),
        )
        problem = next((message for bad, message in checks if bad), None)
        if problem:
            raise BadInputError(f"flagged item #{i}: {problem}")
        types += [str(op_type)] if op_type not in types else []
        names += [str(op_name)] if op_name and op_name not in names else []
        lines.append(f"#   {op_type} {op_name or ''} shapes={shapes} dtype={dtype}")
    config: dict[str, list[str]] = {"tune_ops_type": types}
    if names:
        config["tune_ops_name"] = names
    absolute = target.resolve()
    readme = [
        f"# AOE operator tuning for {len(flagged)} operator(s) pypto-tune flagged ({AOE_DOC})",
        "# 1. dump the operator graphs: call torch_npu.npu.set_aoe("
        f"{str(dump_dir)!r}) before the step, run one step",
        "# 2. tune only these operators (AOE job type 2 = operator tuning):",
        aoe_command(absolute, dump_dir),
        "# 3. rerun the step: the tuned tilings are picked up from AOE's custom repository",
        "# flagged:",
        *lines,
    ]
    for path, text in ((target.parent / f"{target.stem}.README.txt", "\n".join(readme)),
                       (target, json.dumps(config, indent=2))):  # fmt: skip
        try:
            atomic_write_text(path, text + "\n")
        except OSError as exc:
            raise OutputWriteError(
                f"cannot write {path} ({exc.strerror or exc}): make {path.parent} writable "
                "or remove what is in the way"
            ) from None
    return target


# ----------------------------------------------------------------------------- advisor

ADVISOR_SOURCE = "msprof-analyze advisor"
_TAIL = 2000


def _tail(text: str | bytes | None) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return redact((text or "")[-_TAIL:], known_secrets())


def parse_advisor_table(text: str) -> list[dict[str, Any]]:
    """Findings from the advisor's terminal table (PrettyTable with a rule after every row).

    Columns No. | Category | Description | Suggestion (``-l en``; the Chinese headers are
    in the same order); a cell may span lines. Its xlsx report holds the same rows.
    """
    findings: list[dict[str, Any]] = []
    cells: list[list[str]] = []
    in_table = False
    for line in text.splitlines():
        if line.startswith("|") and line.strip("| ").startswith("No."):
            in_table, cells = True, []
        elif in_table and line.startswith("+"):
            if cells and any(cells[0]):
                text_of = [redact(" ".join(filter(None, c)), known_secrets()) for c in cells]
                suggestion = redact("\n".join(filter(None, cells[3])), known_secrets())
                findings.append({"source": ADVISOR_SOURCE, "title": text_of[1],
                                 "detail": text_of[2], "suggestion": suggestion,
                                 "index": text_of[0]})  # fmt: skip
            cells = []
        elif in_table and line.startswith("|"):
            parts = [p.strip() for p in line.strip()[1:-1].split("|")]
            if len(parts) >= 4:
                cells = cells or [[], [], [], []]
                merged = [parts[0], parts[1], "|".join(parts[2:-1]), parts[-1]]
                for col, part in zip(cells, merged, strict=True):
                    col.append(part)
        else:
            in_table = False
    return findings


def run_msprof_advisor(
    folder: Path | str, timeout_s: float = 600, *, output_dir: Path | str | None = None
) -> dict[str, Any]:
    """Ascend's own advisor (``msprof-analyze advisor all``) on a ``*_ascend_pt`` folder.

    Returns {"available": False, "reason"} when msprof-analyze is not on PATH. Otherwise
    {"available": True, "ok", "returncode", "command", "findings": [{"source", "title",
    "detail", "suggestion", "index"}], "tune_ops_name"?, "stderr_tail"?, "reports"?}; a
    failing or hanging advisor is reported in that dict, never raised. Its reports (html,
    xlsx, the AOE tune_ops file) are kept only when ``output_dir`` is given.
    """
    exe = shutil.which("msprof-analyze")
    if exe is None:
        why = "msprof-analyze is not on PATH; `pip install msprof-analyze` adds Ascend's advisor"
        return {"available": False, "reason": why}
    src = Path(folder)
    if not src.is_dir():
        raise BadInputError(
            f"{src} is not a folder; pass the *_ascend_pt folder the profiler wrote"
        )
    with tempfile.TemporaryDirectory(prefix="pypto-tune-advisor-") as tmp:
        # Absolute: the advisor runs in this folder, and a relative -o named out/out/.
        out = Path(output_dir if output_dir is not None else tmp).resolve()
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInputError(
                f"cannot keep the advisor's reports in {out} ({exc.strerror})"
            ) from None
        argv = [exe, "advisor", "all", "-d", str(src.resolve()), "-o", str(out), "-l", "en"]
        result: dict[str, Any] = {"available": True, "ok": False, "findings": []}
        for attempt in (argv, argv[:-2]):  # releases before the -l option refuse it
            result["command"] = redact_argv(attempt, known_secrets())
            try:
                proc = subprocess.run(attempt, cwd=out, capture_output=True, text=True,
                                      errors="replace", timeout=timeout_s,
                                      stdin=subprocess.DEVNULL, check=False)  # fmt: skip
            except subprocess.TimeoutExpired as exc:
                why = f"timed out after {timeout_s:g}s"
                return {**result, "error": why, "stderr_tail": _tail(exc.stderr)}
            except OSError as exc:
                return {**result, "error": f"could not run msprof-analyze ({exc.strerror})"}
            if proc.returncode == 0 or "no such option" not in (proc.stderr or "").lower():
                break
        result.update(returncode=proc.returncode, ok=proc.returncode == 0,
                      findings=parse_advisor_table(proc.stdout or ""))  # fmt: skip
        if proc.returncode != 0:
            result["stderr_tail"] = _tail(proc.stderr or proc.stdout)
        elif not result["findings"] and not advisor_inputs(src):
            # The advisor exits 0 with "no optimization suggestions" whether it found
            # nothing wrong or loaded nothing at all: only the second is said here.
            result.update(ok=False, error=(
                f"msprof-analyze loaded no profiling data from {src}: it holds none of "
                f"{', '.join(ADVISOR_INPUTS)} under {_OUTPUT_DIR}/ (its 'no optimization "
                "suggestions' means nothing was read, not that nothing is wrong)"))  # fmt: skip
        if tune := _tune_ops(out):
            result["tune_ops_name"] = tune
        if output_dir is not None:
            kept = ("mstt_advisor_", "operator_tuning_file_")
            result["reports"] = sorted(str(p) for p in out.rglob("*") if p.name.startswith(kept))
    return result


#: The files under ASCEND_PROFILER_OUTPUT Ascend's advisor analyses (any one is data).
ADVISOR_INPUTS = (
    "kernel_details.csv",
    "op_summary.csv",
    "op_statistic.csv",
    "trace_view.json",
    "step_trace_time.csv",
)


def advisor_inputs(folder: Path) -> list[str]:
    """Which of :data:`ADVISOR_INPUTS` ``folder`` (a ``*_ascend_pt`` folder or its
    ASCEND_PROFILER_OUTPUT) holds as regular files."""
    out = folder if folder.name == _OUTPUT_DIR else folder / _OUTPUT_DIR
    found = []
    for name in ADVISOR_INPUTS:
        path = out / name
        if path.is_file() and not path.is_symlink():
            found.append(name)
    return found


def _tune_ops(out: Path) -> list[str]:
    """Operator names from the advisor's ``operator_tuning_file_<ts>.cfg`` (AOE's format)."""
    names: list[str] = []
    for cfg in sorted(out.glob("operator_tuning_file_*.cfg")):
        if cfg.is_symlink() or not cfg.is_file() or cfg.stat().st_size > 1024 * 1024:
            continue
        try:
            data = json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("tune_ops_name"), list):
            names += [n for n in data["tune_ops_name"] if isinstance(n, str) and n not in names]
    return names
