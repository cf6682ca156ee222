"""The report: one JSON document per run, versioned by ``schema_version``.

The schema ships as ``report.schema.json`` next to this module (JSON Schema draft
2020-12). A change that removes or renames a field bumps the major version; adding
optional fields bumps the minor. ``validate_report`` checks a document with
``jsonschema`` when it is installed and otherwise with a small built-in check of the
required structure, so the bench itself needs no extra dependency.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import secrets
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pypto_common import atomic_write_text, redact, redact_argv, redact_obj

from .config import Arm, Placement
from .errors import BadInputError, ReportPathError, ReportWriteError

__all__ = [
    "CPU_MEMORY_HEADERS",
    "DIFFUSION_HEADERS",
    "HEADERS",
    "NOT_COMPARABLE",
    "SCHEMA_VERSION",
    "SWEEP_HEADERS",
    "ArmResult",
    "Report",
    "arm_rows",
    "check_report_path",
    "diffusion_rows",
    "distributed_lines",
    "failure_lines",
    "fallback_dirs",
    "format_table",
    "headers",
    "interval_text",
    "kv_cache_line",
    "load_report",
    "memory_note",
    "mitigations_line",
    "model_section",
    "new_report",
    "noise_lines",
    "numerics_line",
    "perplexity_text",
    "ratio_cell",
    "reference_line",
    "report_to_markdown",
    "schedule_lines",
    "schema",
    "step_latency_line",
    "sweep_rows",
    "underlying_error",
    "validate_report",
    "vl_line",
    "with_suppress_unlink",
    "write_report",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = "1.6"


def _empty_stats() -> dict[str, Any]:
    return {"samples": [], "best": None, "median": None, "mean": None, "stdev": None}


@dataclass
class ArmResult:
    """One arm's outcome. Statistics are over the same ``iters`` samples for every arm."""

    name: str
    ok: bool = True
    tokens_per_s: dict[str, Any] = field(default_factory=_empty_stats)
    seconds: dict[str, Any] = field(default_factory=_empty_stats)
    ttft_s: dict[str, Any] | None = None
    tokens_per_iter: list[int] = field(default_factory=list)
    ratio_to_eager: float | None = None
    #: Best tok/s over the hf-compile arm's (transformers' static cache + compile): how
    #: this arm compares with the recipe a user would otherwise pick. None without it.
    ratio_to_peer: float | None = None
    token_match: dict[str, Any] | None = None
    #: Why this arm's outputs are not the model's on purpose (e.g. the static MoE proxy);
    #: such an arm gets no token-match verdict. None: its outputs must equal eager's.
    outputs_differ_by_design: str | None = None
    memory: dict[str, Any] | None = None
    roofline: dict[str, Any] | None = None
    error: str | None = None
    explanation: dict[str, Any] | None = None
    bisect: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    #: The median of the per-round paired ratios (this arm's tok/s over eager's in the same
    #: round) with its 95% interval: ``{"median", "low", "high", "rounds", "method",
    #: "level"}`` (pypto_bench.intervals). None: no eager arm, or this one failed.
    ratio_vs_eager: dict[str, Any] | None = None
    #: The same against the hf-compile arm's rounds; None without it.
    ratio_vs_peer: dict[str, Any] | None = None
    #: Set by the noise guard (pypto_bench.noise) when this arm's timing verdicts cannot
    #: be trusted: ``{"verdicts": ["tok/s", "x eager", "roofline %"], "why": "..."}``.
    unreliable: dict[str, Any] | None = None
    #: The numerical gate's verdict (pypto_bench.numerics): ``{"verdict": "pass" | "fail" |
    #: "exempt" | "not checked", "why", ...}`` with the metrics and the allowance it was
    #: judged against. A failed arm's ratios are None: they are not comparable. None:
    #: eager (the reference), a failed arm, or a report before 1.5.
    numerics: dict[str, Any] | None = None


@dataclass
class Report:
    schema_version: str
    tool: dict[str, Any]
    created_at: str
    command_line: list[str]
    environment: dict[str, Any]
    config: dict[str, Any]
    regime: str
    model: dict[str, Any] = field(default_factory=dict)
    roofline: dict[str, Any] | None = None
    arms: list[ArmResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ok: bool = True
    #: The noise guard's checks (pypto_bench.noise.noise_section); ``noise["noisy"]`` is
    #: the report-level flag. None: not assessed (reports before 1.2).
    noise: dict[str, Any] | None = None
    #: ``--batch 1,8,32``: one entry per batch (tok/s per arm, the roofline against both
    #: ceilings); None for a single batch.
    batch_sweep: list[dict[str, Any]] | None = None
    #: The order of the timed iterations (pypto_bench.rounds): ``{"kind": "interleaved" |
    #: "sequential", "order": [[arm, round], ...], "rounds", ...}``, with ``target_ci``
    #: (whether ``--target-ci`` was met and why the rounds stopped). None: not recorded
    #: (reports before 1.4, multi-device runs).
    schedule: dict[str, Any] | None = None
    #: ``--nproc N`` (pypto_bench.multi): ranks, backend, aggregate tok/s, per-rank
    #: step time / communication share / memory, the 1-rank baseline, scaling efficiency
    #: and agreement with it; None for a single-process run.
    distributed: dict[str, Any] | None = None
    #: ``--reference DEVICE`` (pypto_bench.reference): the eager arm's logits against the
    #: same folder on DEVICE, its verdict, the numbers and the first diverging module of a
    #: failure; None without ``--reference`` (and in reports before 1.6).
    reference_check: dict[str, Any] | None = None
    #: Where ``run_bench`` actually wrote the report (the fallback path when the asked
    #: one failed); not part of the document.
    written_to: Path | None = field(default=None, compare=False, repr=False)

    def arm(self, name: str) -> ArmResult | None:
        return next((a for a in self.arms if a.name == name), None)

    @property
    def failed_arms(self) -> list[str]:
        """Failed arms; in a sweep, those of the other batches as ``"graph (batch 8)"``."""
        failed = [a.name for a in self.arms if not a.ok]
        for entry in (self.batch_sweep or [])[1:]:
            failed += [
                f"{a['name']} (batch {entry['batch']})" for a in entry["arms"] if not a["ok"]
            ]
        return failed

    @property
    def failed_arm_causes(self) -> list[str]:
        """:attr:`failed_arms`, each with the exception under its failure where known:
        ``"graph (KeyError: 'full_attention')"``, the one line a CLI ends a failed run with."""
        out = []
        for name in self.failed_arms:
            arm = self.arm(name)
            cause = underlying_error(arm.explanation) if arm is not None else None
            out.append(f"{name} ({cause})" if cause else name)
        return out

    def finish(self) -> None:
        """Ratios to eager and the overall verdict (any failed arm -> not ok)."""
        eager = self.arm(Arm.EAGER)
        base = eager.tokens_per_s.get("best") if eager and eager.ok else None
        peer = self.arm(Arm.HF_COMPILE)
        peer_base = peer.tokens_per_s.get("best") if peer and peer.ok else None
        for arm in self.arms:
            best = arm.tokens_per_s.get("best")
            arm.ratio_to_eager = (best / base) if (base and best and arm.ok) else None
            arm.ratio_to_peer = (best / peer_base) if (peer_base and best and arm.ok) else None
        self._fill_intervals(eager, peer)
        for arm in self.arms:
            if (arm.numerics or {}).get("verdict") == "fail":
                # No ratio of an arm that computes something else reaches any output.
                arm.ratio_to_eager = arm.ratio_to_peer = None
                arm.ratio_vs_eager = arm.ratio_vs_peer = None
            if arm.name == Arm.HF_COMPILE and (arm.numerics or {}).get("verdict") == "fail":
                for other in self.arms:  # a ratio to a wrong peer is no ratio either
                    other.ratio_to_peer = other.ratio_vs_peer = None
        self.ok = not self.failed_arms

    @property
    def reference_failed(self) -> bool:
        """``--reference``: the eager arm's logits failed against the reference device."""
        return (self.reference_check or {}).get("verdict") == "fail"

    @property
    def numerics_failed(self) -> list[str]:
        """Arms the numerical gate failed (pypto_bench.numerics)."""
        return [a.name for a in self.arms if (a.numerics or {}).get("verdict") == "fail"]

    def _fill_intervals(self, eager: ArmResult | None, peer: ArmResult | None) -> None:
        """Each ok arm's tok/s median with its 95% interval (``tokens_per_s["interval"]``)
        and its paired ratios' (``ratio_vs_eager`` / ``ratio_vs_peer``): sample ``r`` of
        one arm over sample ``r`` of the other, i.e. round ``r`` of an interleaved run
        (pypto_bench.intervals says how the interval is made)."""
        from .intervals import bootstrap_median, paired_ratios

        def samples(a: ArmResult | None) -> list[float] | None:
            if a is None or not a.ok:
                return None
            return list(a.tokens_per_s.get("samples") or []) or None

        base, peer_base = samples(eager), samples(peer)
        for arm in self.arms:
            own = samples(arm)
            arm.ratio_vs_eager = arm.ratio_vs_peer = None
            if own is None:
                continue
            arm.tokens_per_s["interval"] = bootstrap_median(own)
            if base is not None and arm is not eager:
                arm.ratio_vs_eager = bootstrap_median(paired_ratios(own, base))
            if peer_base is not None and arm is not peer:
                arm.ratio_vs_peer = bootstrap_median(paired_ratios(own, peer_base))

    def to_dict(self) -> dict[str, Any]:
        """The JSON document, secrets redacted: whatever reaches a file or stdout passes here.

        Redaction happens at this one exit (not only where the command line is
        recorded) because arm errors and warnings quote exception text, which can carry
        a URL with credentials or a token read from the environment.
        """
        data = _jsonable(asdict(self))
        data.pop("written_to", None)
        data["command_line"] = redact_argv(data.get("command_line") or [])
        return redact_obj(data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def write(self, path: str | Path) -> Path:
        return write_report(self, path)


def _jsonable(value: Any) -> Any:
    """NaN/inf are not JSON: they become null so every report parses everywhere."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def new_report(config: Any, *, device: Any, device_name: str | None) -> Report:
    from .environment import environment_metadata

    return Report(
        schema_version=SCHEMA_VERSION,
        tool={"name": "pypto-bench", "version": _own_version()},
        created_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        command_line=redact_argv(config.command_line if config.command_line else sys.argv),
        environment=environment_metadata(device, device_name),
        config=config.to_dict(),
        regime=config.regime,
    )


def model_section(
    model: Any,
    *,
    path: str | Path,
    model_type: str | None,
    load_s: float,
    load_memory: dict[str, Any],
    parameters: int | None = None,
) -> dict[str, Any]:
    """The report's ``model`` section for a loaded ``model`` (one shape for every run).

    ``parameters``: the whole model's count where ``model`` is a shard (default: its own
    parameters); ``load_memory``: the load's peaks (None where the device keeps none)
    and the resident-set figures (``measure.RssPeak.result()``).
    """
    return {
        "path": str(path),
        "class": type(model).__name__,
        "model_type": model_type,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "parameters": (
            parameters if parameters is not None else sum(p.numel() for p in model.parameters())
        ),
        "load_s": load_s,
        "load_memory": load_memory,
    }


def _own_version() -> str:
    try:
        from importlib.metadata import version

        return version("pypto-bench")
    except Exception:
        return "0+unknown"


def check_report_path(
    path: str | Path, *, flag: str = "--report-file", example: str = "report.json"
) -> Path:
    """Fail before the run (not after minutes of benchmarking) if ``path`` is unwritable;
    ``flag`` names the option in the message (``--report-file``, ``--html``)."""
    what = "report" if flag == "--report-file" else flag
    p = Path(path).expanduser()
    if p.is_dir():
        raise ReportPathError(
            f"{what} path {p} is a folder: pass a file name such as {p}/{example}"
        )
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ReportPathError(
            f"{what} folder {parent} does not exist: create it or pick another path"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ReportPathError(f"{what} folder {parent} is not writable: pick another {flag}")
    if p.exists() and not os.access(p, os.W_OK):
        raise ReportPathError(f"{what} file {p} is not writable: pick another {flag}")
    return p


def _report_text(report: Report | dict[str, Any]) -> str:
    if isinstance(report, Report):
        return report.to_json() + "\n"
    data = redact_obj(_jsonable(report))
    if isinstance(data.get("command_line"), list):
        data["command_line"] = redact_argv(data["command_line"])
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def fallback_dirs() -> list[Path]:
    """Where a report goes when its own path fails: ``$TMPDIR`` (else the system temp
    folder), then the cwd.

    ``$TMPDIR`` is taken as given rather than through ``tempfile.gettempdir()``, which
    silently moves on to ``/var/tmp`` or elsewhere: the user must be told one
    predictable place.
    """
    first = os.environ.get("TMPDIR") or tempfile.gettempdir()
    dirs = [Path(first), Path.cwd()]
    return list(dict.fromkeys(dirs))


def _write_fallback(text: str, dirs: Sequence[Path]) -> tuple[Path | None, list[str]]:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    problems: list[str] = []
    for folder in dirs:
        # A fresh name, written by the one atomic writer (temp file + rename).
        target = Path(folder) / f"pypto-bench-report-{stamp}-{secrets.token_hex(4)}.json"
        try:
            return atomic_write_text(target, text), problems
        except OSError as err:
            problems.append(f"{folder}: {err.strerror or err}")
    return None, problems


def write_report(
    report: Report | dict[str, Any],
    path: str | Path,
    *,
    fallback: bool = True,
    fallback_dir: Sequence[str | Path] | None = None,
) -> Path:
    """Write the report atomically and return the path it actually went to.

    The report is the product of a long run, so a failing write (the folder vanished,
    the disk filled, the file system went read-only) must not throw the results away:
    with ``fallback`` (the default) the report is written to
    ``$TMPDIR/pypto-bench-report-<timestamp>-*.json`` (else the cwd; or
    ``fallback_dir``), a warning names that path, and that path is returned; compare it
    with ``path`` to know. Raises ``ReportWriteError`` (its ``text`` holds the JSON)
    when no place takes it, and ``ReportPathError`` when ``fallback`` is off.
    """
    text = _report_text(report)
    try:
        p = check_report_path(path)
        atomic_write_text(p, text)
        if isinstance(report, Report):
            report.written_to = p
        return p
    except (OSError, ReportPathError) as err:
        reason = (
            str(err)
            if isinstance(err, ReportPathError)
            else f"writing {path} failed: {err.strerror or err}"
        )
        reason = redact(reason)
        if not fallback:
            if isinstance(err, ReportPathError):
                raise
            raise ReportPathError(f"{reason}: pick another --report-file") from err
        dirs = [Path(d) for d in fallback_dir] if fallback_dir is not None else fallback_dirs()
        written, problems = _write_fallback(text, dirs)
        if written is None:
            raise ReportWriteError(
                f"{reason}; no fallback folder took it either ({'; '.join(problems)}): "
                "free disk space or pass a writable --report-file",
                text,
            ) from err
        log.warning("%s; the report was saved to %s instead", reason, written)
        if isinstance(report, Report):
            report.written_to = written
        return written


def with_suppress_unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def schema() -> dict[str, Any]:
    """The report's JSON Schema (shipped in the package)."""
    text = resources.files("pypto_bench").joinpath("report.schema.json").read_text()
    return json.loads(text)


def validate_report(data: dict[str, Any]) -> None:
    """Raise BadInputError when ``data`` is not a valid report of a known schema."""
    version = str(data.get("schema_version", "")) if isinstance(data, dict) else ""
    if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise BadInputError(
            f"report schema_version {version or 'missing'} is not {SCHEMA_VERSION}: regenerate it with this pypto-bench"
        )
    try:
        import jsonschema
    except ImportError:
        _basic_validate(data)
        return
    try:
        jsonschema.validate(data, schema())
    except jsonschema.ValidationError as err:
        where = "/".join(str(p) for p in err.absolute_path) or "<root>"
        raise BadInputError(f"invalid report at {where}: {err.message}") from err


def _basic_validate(data: dict[str, Any]) -> None:
    for key in schema()["required"]:
        if key not in data:
            raise BadInputError(f"invalid report: missing {key!r}")
    for i, arm in enumerate(data["arms"]):
        for key in ("name", "ok", "tokens_per_s"):
            if key not in arm:
                raise BadInputError(f"invalid report: arms/{i} lacks {key!r}")


def load_report(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError as err:
        raise BadInputError(f"report {p} does not exist") from err
    except (OSError, json.JSONDecodeError) as err:
        raise BadInputError(f"report {p} is not readable JSON: {err}") from err
    validate_report(data)
    return data


# --- rendering ------------------------------------------------------------------------


def _as_dict(report: Report | dict[str, Any]) -> dict[str, Any]:
    return report.to_dict() if isinstance(report, Report) else report


def _fmt(v: Any, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _mib(v: Any) -> str:
    return "-" if v is None else f"{v / 2**20:.1f}"


def _host_memory(data: dict[str, Any]) -> bool:
    """CPU reports show the resident-set peak: allocator counters do not exist there."""
    return ((data.get("environment") or {}).get("device") or {}).get("type") == "cpu"


def _memory_cells(data: dict[str, Any], mem: dict[str, Any]) -> list[str]:
    """RSS peak / RSS after on CPU ("-" when unmeasured, never an allocator 0), else the
    allocator's peak allocated / reserved."""
    if _host_memory(data):
        return [_mib(mem.get("rss_peak_bytes")), _mib(mem.get("rss_bytes"))]
    return [_mib(mem.get("peak_allocated")), _mib(mem.get("peak_reserved"))]


def _memory_note(data: dict[str, Any]) -> str | None:
    """Why a CPU report's RSS columns show "-" (the reason recorded per arm)."""
    if not _host_memory(data):
        return None
    reasons = sorted(
        {
            str((a.get("memory") or {}).get("rss_unavailable"))
            for a in data["arms"]
            if (a.get("memory") or {}).get("rss_unavailable")
        }
    )
    return f"memory: resident-set peak not measured: {'; '.join(reasons)}" if reasons else None


def headers(data: dict[str, Any]) -> list[str]:
    """The arm table's columns; the memory ones name what was measured on this device."""
    if not _host_memory(data):
        return list(HEADERS)
    return [CPU_MEMORY_HEADERS.get(h, h) for h in HEADERS]


def _rows(data: dict[str, Any]) -> list[list[str]]:
    rows = []
    for arm in data["arms"]:
        tps = arm["tokens_per_s"]
        mem = arm.get("memory") or {}
        match = (arm.get("token_match") or {}).get("rate")
        by_design = bool(arm.get("outputs_differ_by_design"))
        roof = (arm.get("roofline") or {}).get("fraction_of_ceiling")
        ttft = (arm.get("ttft_s") or {}).get("median")
        wrong = (arm.get("numerics") or {}).get("verdict") == "fail"
        rows.append(
            [
                arm["name"],
                ("NUMERICS FAIL" if wrong else "ok") if arm["ok"] else "FAILED",
                _fmt(tps.get("best")),
                _fmt(tps.get("median")),
                _fmt(tps.get("mean")),
                _fmt(tps.get("stdev")),
                _fmt(ttft * 1000 if ttft is not None else None, ".2f"),
                NOT_COMPARABLE if wrong else ratio_cell(arm, "ratio_vs_eager", "ratio_to_eager"),
                NOT_COMPARABLE if wrong else ratio_cell(arm, "ratio_vs_peer", "ratio_to_peer"),
                "by design"
                if by_design
                else _fmt(match * 100 if match is not None else None, ".1f"),
                *_memory_cells(data, mem),
                _fmt(roof * 100 if roof is not None else None, ".1f"),
                _noise_cell(data, arm),
            ]
        )
    return rows


#: What a ratio cell of an arm the numerical gate failed says.
NOT_COMPARABLE = "not comparable"


def numerics_line(arm: dict[str, Any]) -> str | None:
    """One line on an arm's numerical verdict for every report surface (None: none)."""
    num = arm.get("numerics") or {}
    verdict = num.get("verdict")
    if verdict is None:
        return None
    if verdict == "fail":
        allowed = " (allowed by --allow-inaccurate)" if num.get("allowed_by_user") else ""
        suspect = num.get("suspect") or {}
        where = ""
        if suspect.get("first_diverging_module"):
            where = (
                f"; suspect: {suspect.get('what')} ({', '.join(suspect.get('plugins') or [])}),"
                f" first diverging module {suspect['first_diverging_module']}"
            )
        elif suspect.get("what"):
            where = f"; suspect: {suspect['what']} ({suspect.get('why')})"
        return (
            f"numerics FAIL{allowed}: {num.get('why')} against {num.get('basis')}; "
            f"its ratios are not comparable{where}{perplexity_text(num)}"
        )
    return f"numerics {verdict}: {num.get('why')}{perplexity_text(num)}"


def step_latency_line(arm: dict[str, Any]) -> str | None:
    """``per-token latency p50 1.20 ms, p90 1.40 ms, p99 2.00 ms (11 steps, ...); first call
    3.2 s; peak memory per phase: capture 812.0 MiB, timed 640.3 MiB`` (the cold start:
    capture or compile, and each phase's own peak) where measured, else None."""
    lat = (arm.get("details") or {}).get("step_latency") or {}
    first = (arm.get("details") or {}).get("capture_s")
    parts = []
    if isinstance(lat.get("p50_ms"), (int, float)):
        parts.append(
            f"per-token latency p50 {lat['p50_ms']:.3g} ms, p90 {lat['p90_ms']:.3g} ms, "
            f"p99 {lat['p99_ms']:.3g} ms ({lat.get('steps')} steps of an untimed pass, "
            "synchronized each step)"
        )
    if isinstance(first, (int, float)):
        parts.append(f"first call (capture / compile, the cold start) {first:.3g} s")
    phases = (arm.get("memory") or {}).get("phases") or {}
    peaks = [
        f"{name} {_mib(_phase_peak(phases[name]))} MiB"
        for name in ("capture", "timed")
        if _phase_peak(phases.get(name) or {}) is not None
    ]
    if peaks:
        parts.append("peak memory per phase: " + ", ".join(peaks))
    return "; ".join(parts) or None


def _phase_peak(phase: dict[str, Any]) -> Any:
    """A phase's peak: the allocator's where it keeps one, else the resident set's."""
    peak = phase.get("peak_allocated")
    return peak if peak is not None else phase.get("rss_peak_bytes")


def perplexity_text(num: dict[str, Any]) -> str:
    """``; perplexity 41.2 (eager 41.2, x1.000) on <text>`` where measured, else ''."""
    ppl = num.get("perplexity") or {}
    if not isinstance(ppl.get("arm"), (int, float)) or not isinstance(
        ppl.get("eager"), (int, float)
    ):
        return ""
    ratio = ppl.get("ratio_to_eager")
    times = f", x{ratio:.4f}" if isinstance(ratio, (int, float)) else ""
    return (
        f"; perplexity {ppl['arm']:.4g} (eager {ppl['eager']:.4g}{times}) on {ppl.get('text')}, "
        f"{ppl.get('tokens')} tokens"
    )


def interval_text(interval: dict[str, Any] | None, spec: str = ".2f") -> str | None:
    """``2.41 [2.30, 2.55]``: a median and its interval (None without one)."""
    if not interval or interval.get("median") is None:
        return None
    return f"{interval['median']:{spec}} [{interval['low']:{spec}}, {interval['high']:{spec}}]"


def ratio_cell(arm: dict[str, Any], interval_key: str, point_key: str) -> str:
    """A ratio column: the paired ratios' median and 95% interval where the report has
    them (1.4 on), else the best-over-best ratio of older reports."""
    return interval_text(arm.get(interval_key)) or _fmt(arm.get(point_key), ".2f")


def _schedule_lines(data: dict[str, Any]) -> list[str]:
    """The schedule, each arm's intervals and ``--target-ci``'s outcome, in words."""
    sched = data.get("schedule")
    lines = []
    if sched:
        text = f"schedule: {sched.get('kind')}, {sched.get('rounds')} round(s)"
        if sched.get("kind") == "interleaved":
            text += " (A B B A ...: arm order reversed every other round)"
        if sched.get("why"):
            text += f"; {sched['why']}"
        lines.append(text)
        target = sched.get("target_ci")
        if target:
            text = (
                f"target CI +-{target['percent']:g}%: "
                f"{'met' if target.get('met') else 'NOT met'} after {target.get('rounds')} "
                f"round(s), stopped: {target.get('stopped')}"
            )
            widest = target.get("widest")
            if widest:
                text += (
                    f" (widest: {widest['arm']} {widest['ratio']} +-"
                    f"{widest['relative_half_width'] * 100:.1f}%)"
                )
            lines.append(text)
    for arm in data["arms"]:
        parts = []
        tps = interval_text((arm.get("tokens_per_s") or {}).get("interval"), ".1f")
        if tps:
            parts.append(f"tok/s {tps}")
        for key, label in (("ratio_vs_eager", "x eager"), ("ratio_vs_peer", "x hf-compile")):
            got = interval_text(arm.get(key))
            if got:
                parts.append(f"{label} {got}")
        if parts:
            rounds = ((arm.get("tokens_per_s") or {}).get("interval") or {}).get("rounds")
            lines.append(
                f"{arm['name']}: {', '.join(parts)} (median [95% interval], {rounds} round(s))"
            )
    return lines


def _noise_cell(data: dict[str, Any], arm: dict[str, Any]) -> str:
    """UNRELIABLE (the noise guard marked this arm), ok, or - (not assessed: older report)."""
    if arm.get("unreliable"):
        return "UNRELIABLE"
    return "-" if data.get("noise") is None else "ok"


def _noise_lines(data: dict[str, Any]) -> list[str]:
    """ "<arm>: UNRELIABLE <verdicts>: <why>" per marked arm, then the run's summary."""
    from .noise import summary

    lines = []
    for arm in data["arms"]:
        mark = arm.get("unreliable")
        if mark:
            lines.append(
                f"{arm['name']}: UNRELIABLE {', '.join(mark.get('verdicts') or [])}: "
                f"{mark.get('why')}"
            )
    line = summary(data.get("noise"))
    if line:
        lines.append(f"NOISE: {line}")
    return lines


SWEEP_HEADERS = [
    "batch",
    "arm",
    "status",
    "tok/s best",
    "median",
    "x eager",
    "MiB/step",
    "GFLOP/step",
    "BW ceiling tok/s",
    "compute ceiling tok/s",
    "binds",
    "% of ceiling",
    "noise",
]


def _sweep_rows(data: dict[str, Any]) -> list[list[str]]:
    """One row per (batch, arm) of a ``--batch 1,8,32`` sweep; empty without one."""
    rows = []
    for entry in data.get("batch_sweep") or []:
        for arm in entry["arms"]:
            tps = arm.get("tokens_per_s") or {}
            roof = arm.get("roofline") or {}
            flops = roof.get("flops_per_step")
            share = roof.get("fraction_of_ceiling")
            rows.append(
                [
                    str(entry["batch"]),
                    arm["name"],
                    "ok" if arm["ok"] else "FAILED",
                    _fmt(tps.get("best")),
                    _fmt(tps.get("median")),
                    ratio_cell(arm, "ratio_vs_eager", "ratio_to_eager"),
                    _mib(roof.get("bytes_per_step")),
                    _fmt(flops / 1e9 if flops is not None else None, ".3g"),
                    _fmt(roof.get("bandwidth_ceiling_tok_s")),
                    _fmt(roof.get("compute_ceiling_tok_s")),
                    str(roof.get("binding") or "-"),
                    _fmt(share * 100 if share is not None else None, ".1f"),
                    "UNRELIABLE" if arm.get("unreliable") else "ok",
                ]
            )
    return rows


def _sweep_lines(data: dict[str, Any]) -> list[str]:
    rows = _sweep_rows(data)
    if not rows:
        return []
    table = [SWEEP_HEADERS, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(SWEEP_HEADERS))]
    lines = ["", "batch sweep (the roofline against both ceilings; binds = the lower one):"]
    lines += [
        "  ".join(
            c.rjust(w) if i > 1 else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in table
    ]
    lines.insert(3, "  ".join("-" * w for w in widths))
    return lines


HEADERS = [
    "arm",
    "status",
    "tok/s best",
    "median",
    "mean",
    "stdev",
    "ttft ms",
    "x eager",
    "x hf-compile",
    "match %",
    "peak alloc MiB",
    "peak rsv MiB",
    "roofline %",
    "noise",
]

#: On CPU the memory columns are the process's resident set (``memory.rss_peak_bytes``,
#: ``memory.rss_bytes``), not allocator counters.
CPU_MEMORY_HEADERS = {"peak alloc MiB": "peak RSS MiB", "peak rsv MiB": "RSS after MiB"}


DIFFUSION_HEADERS = [
    "arm",
    "path",
    "tok/forward",
    "forwards/s",
    "denoising steps",
    "forward passes",
    "steps per block",
]


def _diffusion_rows(data: dict[str, Any]) -> list[list[str]]:
    """The diffusion-generate figures per arm (``details.diffusion``): which path ran,
    tokens per forward (TPF), denoising forwards per second (FPS), the last iteration's
    denoising steps (NFE), all forward passes (cache fills included), steps per block."""
    rows = []
    for arm in data["arms"]:
        diff = (arm.get("details") or {}).get("diffusion")
        if not arm.get("ok") or not diff:
            continue
        steps = diff.get("denoising_steps_per_iter") or [None]
        passes = diff.get("forward_passes_per_iter") or [None]
        per_block = diff.get("steps_per_block")
        rows.append(
            [
                arm["name"],
                str(diff.get("path") or "-"),
                _fmt((diff.get("tokens_per_forward") or {}).get("median"), ".2f"),
                _fmt((diff.get("forwards_per_s") or {}).get("median"), ".2f"),
                "-" if steps[-1] is None else str(steps[-1]),
                "-" if passes[-1] is None else str(passes[-1]),
                "-" if per_block is None else ",".join(str(n) for n in per_block),
            ]
        )
    return rows


def underlying_error(explanation: dict[str, Any] | None) -> str | None:
    """``"KeyError: 'full_attention'"``: the exception under a failure's wrappers, from its
    explanation dict (``cause_type`` / ``cause_message``). None when unknown, or when the
    report came from a pypto-capture that did not record it."""
    kind = (explanation or {}).get("cause_type")
    if not kind:
        return None
    message = (explanation or {}).get("cause_message")
    return f"{kind}: {message}" if message else str(kind)


def failure_lines(arm: dict[str, Any]) -> list[str]:
    """Why a failed arm failed, for every rendering: its error, then (where known) the
    underlying error, the matched cause and fix, and bisect's first failing stage."""
    out = [str(arm.get("error"))]
    expl = arm.get("explanation") or {}
    underlying = underlying_error(expl)
    if underlying and underlying not in str(arm.get("error")):
        out.append(f"underlying error: {underlying}")
    if expl.get("matched"):
        out.append(f"cause: {expl.get('cause')}  fix: {expl.get('fix')}")
    stage = (arm.get("bisect") or {}).get("failed_stage")
    if stage:
        out.append(f"bisect: first failing stage {stage}")
    return out


def _arm_lines(data: dict[str, Any], makers: Sequence[Any], fmt: str) -> list[str]:
    """Each arm's lines from ``makers`` (a maker returns a line or None), in ``fmt``."""
    out = []
    for arm in data["arms"]:
        for make in makers:
            line = make(arm)
            if line:
                out.append(fmt.format(name=arm["name"], line=line))
    return out


def format_table(report: Report | dict[str, Any]) -> str:
    """Plain-text table for the terminal."""
    data = _as_dict(report)
    head = headers(data)
    rows = [head, *_rows(data)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for row in _diffusion_rows(data):
        lines.append(
            f"{row[0]}: {row[1]}; tok/forward {row[2]}, forwards/s {row[3]} (medians); "
            f"denoising steps {row[4]}, forward passes {row[5]}, steps per block [{row[6]}]"
        )
    lines += _schedule_lines(data)
    lines += _noise_lines(data)
    vl = vl_line(data)
    if vl:
        lines.append(vl)
    note = _memory_note(data)
    if note:
        lines.append(note)
    lines += _arm_lines(data, (_kv_cache_line, _mitigations_line), "{name}: {line}")
    for arm in data["arms"]:
        if arm.get("outputs_differ_by_design"):
            lines.append(
                f"{arm['name']}: outputs differ by design ({arm['outputs_differ_by_design']})"
            )
        if not arm["ok"]:
            first, *more = failure_lines(arm)
            lines.append(f"{arm['name']}: {first}")
            lines += [f"  {m}" for m in more]
    lines += _arm_lines(data, (numerics_line, step_latency_line), "{name}: {line}")
    ref_line = reference_line(data.get("reference_check"))
    if ref_line:
        lines.append(f"eager: {ref_line}")
    lines += _sweep_lines(data)
    lines += _distributed_lines(data)
    return "\n".join(lines)


def _ranks_line(dist: dict[str, Any]) -> str:
    """``2 ranks``, or ``2 nodes x 1 ranks (2 ranks, 1 host)`` for a multi-node run."""
    n = dist["nproc"]
    nnodes = int(dist.get("nnodes") or 1)
    if nnodes == 1:
        hosts = int(dist.get("nodes") or 1)
        return f"{n} ranks" + (f" on {hosts} hosts" if hosts > 1 else "")
    hosts = int(dist.get("nodes") or 1)
    return (
        f"{nnodes} nodes x {dist.get('nproc_per_node')} ranks ({n} ranks, "
        f"{hosts} host{'s' if hosts != 1 else ''})"
    )


def _distributed_lines(data: dict[str, Any]) -> list[str]:
    """``--nproc N``: the aggregate against the 1-rank run, then one line per rank."""
    dist = data.get("distributed")
    if not dist:
        return []
    base = (dist.get("baseline") or {}).get("tokens_per_s") or {}
    comm = dist.get("communication_share") or {}
    agree = dist.get("agreement") or {}
    pipeline = dist.get("placement") == Placement.PIPELINE
    tok_s = _fmt((dist.get("aggregate_tokens_per_s") or {}).get("best"))
    head = (
        f"{dist['nproc']} pipeline stages (one process, layers split over the devices): {tok_s} tok/s"
        if pipeline
        else f"{_ranks_line(dist)} ({dist.get('backend')}, {dist.get('threads_per_rank')} "
        f"thread(s) each): aggregate {tok_s} tok/s"
    )
    if dist.get("baseline") is None:
        vs = f"; no 1-rank run ({dist.get('baseline_skipped') or 'skipped'})"
    else:
        what = "tokens" if "token" in str(agree.get("compared") or "") else "outputs"
        scale = (
            f"speedup not comparable ({dist['not_comparable']})"
            if dist.get("not_comparable")
            else f"speedup {_fmt(dist.get('speedup'), '.2f')}, scaling efficiency "
            f"{_fmt(dist.get('scaling_efficiency'), '.2f')}"
        )
        vs = (
            f" vs 1 rank {_fmt(base.get('best'))}: {scale}; {what} agree with 1 rank: "
            f"{'yes' if agree.get('ok') else 'NO'}"
        )
    lines = [
        head + vs + f"; communication share {_fmt(comm.get('min'), '.2f')}-"
        f"{_fmt(comm.get('max'), '.2f')}"
    ]
    for r in dist.get("ranks") or []:
        if pipeline:
            span = "..".join(dict.fromkeys(r.get("layers") or [])) or "no layers"
            lines.append(
                f"  stage {r.get('rank')}: {r.get('device')}, {r.get('layer_count')} layer(s) "
                f"{span}, {_mib(r.get('layer_bytes'))} MiB of layer weights"
            )
            continue
        step = r.get("step_s") or {}
        share = (r.get("communication") or {}).get("share")
        mem = r.get("memory") or {}
        peak = mem.get("peak_allocated") or mem.get("rss_peak_bytes")
        lines.append(
            f"  rank {r.get('rank')}: step ms min/median/max "
            + "/".join(
                _fmt(float(step[k]) * 1e3 if step.get(k) else None, ".2f")
                for k in ("min", "median", "max")
            )
            + f", communication {_fmt(share * 100 if share is not None else None)}%, "
            f"memory {_mib(peak)} MiB"
        )
    return lines


def _mitigations_line(arm: dict[str, Any]) -> str | None:
    """The capture mitigations a graph arm applied (``details.mitigations``), when any."""
    applied = ((arm.get("details") or {}).get("mitigations") or {}).get("applied")
    if not applied:
        return None
    return "capture mitigations: " + ", ".join(str(a) for a in applied)


def _kv_cache_line(arm: dict[str, Any]) -> str | None:
    """The capture-safe cache's layout (graph arms): what each layer type holds."""
    cache = (arm.get("details") or {}).get("kv_cache")
    if not cache:
        return None
    slots = ", ".join(f"{t} {n}" for t, n in cache.get("slots_per_type", {}).items())
    line = f"KV cache: {cache.get('pattern')}; slots per layer type: {slots or 'none'}; "
    states = _state_summary(cache.get("layers") or [])
    if states:
        # Recurrent layers (linear attention, SSM, short conv): fixed-shape states, read and
        # written by every step whatever the context length.
        line += f"recurrent state per layer type: {states}; "
        line += f"states {cache.get('state_bytes', 0) / 2**20:.2f} MiB, "
    if cache.get("indexer_bytes"):
        # Sparse-attention (DSA) layers: the indexer's keys, one head, at the ring's slots.
        line += f"indexer keys {cache['indexer_bytes'] / 2**20:.2f} MiB, "
    return line + f"{cache.get('total_bytes', 0) / 2**20:.2f} MiB in all"


def _state_summary(layers: list[dict[str, Any]]) -> str:
    """``linear_attention x2: conv [1, 96, 4], recurrent [1, 4, 16, 16]`` per layer type."""
    by_type: dict[str, tuple[int, str]] = {}
    for entry in layers:
        states = entry.get("states")
        if not states:
            continue
        shapes = ", ".join(
            f"{name} " + " + ".join(str(list(shape)) for shape in shapes)
            for name, shapes in states.items()
        )
        count, _ = by_type.get(entry.get("type", "?"), (0, shapes))
        by_type[entry.get("type", "?")] = (count + 1, shapes)
    return "; ".join(f"{t} x{n}: {shapes}" for t, (n, shapes) in by_type.items())


def report_to_markdown(report: Report | dict[str, Any]) -> str:
    """Markdown rendering (a heading line, the run's identity and the arm table)."""
    data = _as_dict(report)
    cfg, env, model = data["config"], data["environment"], data.get("model") or {}
    versions = env.get("versions", {})
    lines = [
        f"**{model.get('class', '?')}** ({model.get('dtype', cfg.get('dtype'))}) on "
        f"**{env.get('device', {}).get('name')}** (`{env.get('device', {}).get('spec')}`), "
        f"regime **{data['regime']}**, batch {cfg['batch']}, seq {cfg['seq']}, gen {cfg['gen']}, "
        f"warmup {cfg['warmup']}, iters {cfg['iters']}, graph backend {cfg['graph_backend']}",
        "",
        "torch "
        + str(versions.get("torch"))
        + ", transformers "
        + str(versions.get("transformers"))
        + (f", torch_npu {versions['torch_npu']}" if versions.get("torch_npu") else "")
        + (f", CANN {versions['cann']}" if versions.get("cann") else "")
        + f"; host `{env.get('host')}`",
        "",
        "| " + " | ".join(headers(data)) + " |",
        "|" + "|".join("---" for _ in HEADERS) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(data)]
    diffusion = _diffusion_rows(data)
    if diffusion:
        lines += [
            "",
            "| " + " | ".join(DIFFUSION_HEADERS) + " |",
            "|" + "|".join("---" for _ in DIFFUSION_HEADERS) + "|",
        ]
        lines += ["| " + " | ".join(r) + " |" for r in diffusion]
    roof = data.get("roofline") or {}
    if roof.get("bandwidth_bytes_per_s"):
        lines += [
            "",
            f"Roofline: measured bandwidth {roof['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, "
            f"weights {roof['weight_bytes'] / 2**20:.1f} MiB read per step, "
            f"KV {roof['kv_bytes_per_token']} B/token"
            + (
                f", measured matmul peak {roof['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s."
                if roof.get("matmul_flops_per_s")
                else "."
            ),
        ]
    sweep = _sweep_rows(data)
    if sweep:
        lines += [
            "",
            "Batch sweep (decode roofline against both ceilings; binds = the lower one):",
            "",
            "| " + " | ".join(SWEEP_HEADERS) + " |",
            "|" + "|".join("---" for _ in SWEEP_HEADERS) + "|",
        ]
        lines += ["| " + " | ".join(r) + " |" for r in sweep]
    intervals = _schedule_lines(data)
    if intervals:
        lines += ["", *(f"- {line}" for line in intervals)]
    lines += _noise_markdown(data)
    vl = vl_line(data)
    if vl:
        lines += ["", f"- {vl}"]
    if data.get("distributed"):
        lines += ["", "```", *_distributed_lines(data), "```"]
    note = _memory_note(data)
    if note:
        lines.append(f"\n- {note}")
    lines += _arm_lines(data, (_kv_cache_line, _mitigations_line), "\n- `{name}` {line}")
    for arm in data["arms"]:
        if arm.get("outputs_differ_by_design"):
            lines.append(
                f"\n- `{arm['name']}`: outputs differ by design ({arm['outputs_differ_by_design']})"
            )
    lines += _arm_lines(data, (numerics_line, step_latency_line), "\n- `{name}` {line}")
    ref_line = reference_line(data.get("reference_check"))
    if ref_line:
        lines.append(f"\n- `eager` {ref_line}")
    failed = [a for a in data["arms"] if not a["ok"]]
    for arm in failed:
        lines.append(f"\n- `{arm['name']}` failed: {arm.get('error')}")
        underlying = underlying_error(arm.get("explanation"))
        if underlying and underlying not in str(arm.get("error")):
            lines.append(f"  (underlying error: `{underlying}`)")
    warnings = list(data.get("warnings", [])) + [
        w for a in data["arms"] for w in a.get("warnings", [])
    ]
    for w in warnings:
        lines.append(f"- warning: {w}")
    return "\n".join(lines) + "\n"


def vl_line(data: Report | dict[str, Any]) -> str | None:
    """What of a vision-language model was benched (``model.vl``), or None for other models.

    A VL checkpoint's numbers without an image are its language model's: the line says so,
    so a reader does not take them for the whole model's.
    """
    vl = (_as_dict(data).get("model") or {}).get("vl")
    if not vl:
        return None
    line = f"vision-language model {vl.get('class')}: benched its {vl.get('benched')}"
    img = vl.get("image")
    if img:
        line += (
            f" ({Path(str(img.get('path'))).name}, {img.get('width')}x{img.get('height')} "
            f"{img.get('format')}; {img.get('image_tokens')} image tokens of "
            f"{img.get('prompt_tokens')} per row; inputs by {img.get('processor')})"
        )
    else:
        line += " (no image: pass --image FILE in the prefill regime to run the vision tower too)"
    return line


def _noise_markdown(data: dict[str, Any]) -> list[str]:
    """The noise guard's verdict: UNRELIABLE lines and, for a noisy run, every check."""
    noise = data.get("noise")
    if not noise:
        return []
    lines = [""]
    for line in _noise_lines(data):
        # The run's summary is also a report warning, listed at the end.
        if not line.startswith("NOISE: "):
            lines.append(f"- **{line.split(': ', 1)[0]}**: {line.split(': ', 1)[1]}")
    if not noise.get("noisy"):
        lines.append("Noise guard: no condition held (spread, roofline share, machine load).")
        return lines
    lines += [
        "",
        "| condition | where | measure | value | threshold | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c in noise.get("checks", []):
        lines.append(
            f"| {c['name']} | {c['where']} | {c['measure']} | {_fmt(c.get('value'), '.2f')} | "
            f"{c['threshold']:g} | {'HOLDS' if c['holds'] else 'ok'} |"
        )
    return lines


# --- the pieces every rendering shows ---------------------------------------------------
# The terminal table and the markdown above, and the HTML page (pypto_bench.html_report),
# show the same cells and lines: one builder each, so a figure cannot read one way in the
# markdown and another on the page.


def arm_rows(report: Report | dict[str, Any]) -> list[list[str]]:
    """The arm table's cells (columns: :func:`headers`), one row per arm."""
    return _rows(_as_dict(report))


def sweep_rows(report: Report | dict[str, Any]) -> list[list[str]]:
    """The batch sweep's cells (columns: ``SWEEP_HEADERS``); empty without a sweep."""
    return _sweep_rows(_as_dict(report))


def diffusion_rows(report: Report | dict[str, Any]) -> list[list[str]]:
    """The diffusion-generate figures per arm (columns: ``DIFFUSION_HEADERS``)."""
    return _diffusion_rows(_as_dict(report))


def schedule_lines(report: Report | dict[str, Any]) -> list[str]:
    """The schedule, ``--target-ci``'s outcome and each arm's intervals, in words."""
    return _schedule_lines(_as_dict(report))


def noise_lines(report: Report | dict[str, Any]) -> list[str]:
    """One line per arm the noise guard marked UNRELIABLE, then the run's NOISE summary."""
    return _noise_lines(_as_dict(report))


def memory_note(report: Report | dict[str, Any]) -> str | None:
    """Why a CPU report's resident-set columns show "-" (None when they do not)."""
    return _memory_note(_as_dict(report))


def distributed_lines(report: Report | dict[str, Any]) -> list[str]:
    """``--nproc N``: the aggregate against the 1-rank run, then one line per rank."""
    return _distributed_lines(_as_dict(report))


def kv_cache_line(arm: dict[str, Any]) -> str | None:
    """A graph arm's capture-safe KV / recurrent-state cache in one line (None without)."""
    return _kv_cache_line(arm)


def mitigations_line(arm: dict[str, Any]) -> str | None:
    """The capture mitigations an arm applied (None when none)."""
    return _mitigations_line(arm)


def reference_line(check: dict[str, Any] | None) -> str | None:
    """``numerics vs cpu float64: pass (KL p99 3e-06, max 4e-06 vs floor 2e-06)``, or the
    failure with its module; None when the run had no ``--reference``."""
    if not isinstance(check, dict):
        return None
    verdict = str(check.get("verdict"))
    where = f"numerics vs {check.get('device')} {check.get('dtype') or ''}".rstrip()
    if verdict not in ("pass", "fail"):
        return f"{where}: {verdict}: {check.get('why')}"
    m = check.get("metrics") or {}
    floor = (check.get("floor_metrics") or {}).get("kl_max")
    text = (
        f"{where}: {'pass' if verdict == 'pass' else 'FAIL'} (KL p99 {_gfmt(m.get('kl_p99'))}, max "
        f"{_gfmt(m.get('kl_max'))} vs floor {_gfmt(floor)}, allowed {_gfmt(check.get('allowed_kl_max'))}; "
        f"top-1 agreement {_pctfmt(m.get('top1_agreement'))})"
    )
    if verdict == "fail":
        module = check.get("first_diverging_module")
        text += f"; first diverging module: {module}" if module else ""
        if check.get("locate_failed"):
            text += f"; locator failed: {check['locate_failed']}"
    return text


def _gfmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else "?"


def _pctfmt(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) else "?"
