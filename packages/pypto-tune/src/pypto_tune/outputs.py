"""Outputs: the versioned JSON, Markdown, a block-breakdown plot and a Chrome trace.

The Chrome trace nests module scopes and operators as complete ("X") slices on their
thread, which the Perfetto UI and chrome://tracing draw as a flame chart: the module
hierarchy is the nesting, so the trace reads like the model's source.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from pypto_common import (
    UntrustedFileError,
    atomic_write,
    loads_bounded,
    read_regular_file,
    redact_obj,
)

from .errors import BadInputError, EnvironmentMissingError, OutputWriteError, ProfileFormatError
from .records import SCHEMA_NAME, SCHEMA_VERSION, Profile
from .render import attribution_line, clip, layer_times, us_text
from .schema import SchemaError, validate_profile
from .summary import step_periods

__all__ = [
    "MAX_PROFILE_BYTES",
    "TORCH_TRACE_NAME",
    "chrome_trace",
    "layer_times",
    "load_profile",
    "plot_blocks",
    "plot_comparison",
    "to_markdown",
    "write_chrome_trace",
    "write_outputs",
    "write_page",
    "write_profile",
]

#: A profile file larger than this is refused (profiles are per-step summaries).
MAX_PROFILE_BYTES = 64 * 2**20


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as null (JSON has no NaN; readers refuse it)."""
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, v in list(items):
            if isinstance(v, float) and not math.isfinite(v):
                node[key] = None
            elif isinstance(v, (dict, list)):
                stack.append(v)
    return value


def _write(path: Path, what: str, writer: Callable[[BinaryIO], object]) -> Path:
    """The one way outputs are written (pypto_common's atomic writer: a link planted at
    ``path`` is replaced, never followed); a failure names the path and the fix."""
    try:
        return atomic_write(path, writer)
    except OSError as err:
        raise OutputWriteError(
            f"cannot write the {what} {path} ({err.strerror or err}): free space, or make "
            f"{path.parent} writable, or write elsewhere (--out DIR; advise without --write)"
        ) from None


def write_profile(p: Profile, path: str | Path) -> Path:
    """The profile JSON, redacted (paths and command lines can carry credentials)."""
    text = json.dumps(_finite(redact_obj(p.to_dict())), indent=1, default=str) + "\n"
    return _write(Path(path), "profile", lambda fh: fh.write(text.encode("utf-8")))


def load_profile(path: str | Path) -> Profile:
    """Read a profile written by this tool; refuses other JSON and newer majors.

    The file is read as untrusted: regular files only (a FIFO or ``/dev/zero`` is
    refused, not read), at most ``MAX_PROFILE_BYTES`` bytes actually read, nesting and
    integer length bounded before parsing, then every field the later stages read is
    checked against the schema (:mod:`.schema`) once, here. Every failure is a
    :class:`ProfileFormatError` (a missing file: :class:`BadInputError`).
    """
    path = Path(path)
    fix = "pass the profile.json written by `pypto-tune profile`"
    try:
        raw = read_regular_file(path, MAX_PROFILE_BYTES)
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such file; {fix}") from None
    except UntrustedFileError as err:
        if "limit" in str(err):
            raise ProfileFormatError(
                f"{path}: larger than any pypto-tune profile ({err}); {fix}"
            ) from None
        raise ProfileFormatError(f"{path}: {err}; {fix}") from None
    except OSError as err:
        raise ProfileFormatError(f"{path}: cannot be read ({err.strerror or err}); {fix}") from None
    try:
        data = loads_bounded(raw)
    except UntrustedFileError as err:
        raise ProfileFormatError(f"{path}: not readable JSON ({err}); {fix}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA_NAME:
        raise ProfileFormatError(
            f'{path}: not a pypto-tune profile (no "schema": "{SCHEMA_NAME}"); {fix}'
        )
    version = str(data.get("schema_version", ""))
    if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise ProfileFormatError(
            f"{path}: profile schema {version[:40]!r}, this pypto-tune reads {SCHEMA_VERSION}; "
            "upgrade pypto-tune or re-profile"
        )
    try:
        validate_profile(data)
    except SchemaError as err:
        raise ProfileFormatError(
            f"{path}: malformed profile ({clip(str(err))}); re-profile"
        ) from None
    return Profile.from_dict(data)


def to_markdown(p: Profile, *, top: int = 15) -> str:
    """Human report: the step, the breakdown, the top operators, findings and advice."""
    m = p.meta
    model = (m.get("model") or {}).get("class") or "model"
    lines = [
        f"# pypto-tune profile: {model}, {m.get('regime')} / {m.get('arm')} arm",
        "",
        f"Device {m.get('device')} ({m.get('dtype')}), profiler {m.get('profiler')} "
        f"({m.get('level')}), batch {m.get('batch')}, seq {m.get('seq')}, gen {m.get('gen')}, "
        f"{p.step.get('count')} steps profiled.",
        "",
        "## Step",
        "",
        f"- time per {p.step.get('unit')}: {us_text(p.step_us)} "
        f"(median {us_text(p.step.get('time_us', {}).get('median'))}, stdev {us_text(p.step.get('time_us', {}).get('stdev'))})",
        f"- device busy {us_text(p.step.get('device_busy_us'))}, host gaps {us_text(p.step.get('host_gap_us'))}, "
        f"utilisation {(p.step.get('utilisation') or 0):.0%}; bound by the "
        f"{(p.step.get('critical_path') or {}).get('bound', '?')}",
        f"- host syncs per step: {p.step.get('host_syncs') or 0:.1f}",
    ]
    if p.peaks:
        lines.append(
            f"- peaks measured in this session: matmul {(p.peaks.get('matmul_flops_per_s') or 0) / 1e12:.3f} TFLOP/s, "
            f"bandwidth {(p.peaks.get('bandwidth_bytes_per_s') or 0) / 1e9:.1f} GB/s"
        )
    lines += ["", "## Time by block", "", "| block | per step | share |", "|---|---:|---:|"]
    for name, b in sorted(p.blocks.items(), key=lambda kv: -kv[1]["us"]):
        lines.append(f"| {name} | {us_text(b['us'])} | {b['share']:.1%} |")
    layers = layer_times(p)
    if layers:
        lines += ["", "## Time by layer", "", "| layer | per step | share |", "|---|---:|---:|"]
        step = p.step_us
        for layer, us in sorted(layers.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"| {layer} | {us_text(us)} | {us / step if step else 0:.1%} |")
    attribution = m.get("attribution")
    if isinstance(attribution, dict):
        lines += ["", "## Inside the captured step", "", attribution_line(attribution)]
    lines += [
        "",
        f"## Top {top} operators",
        "",
        "| operator | module | block | calls/step | time/step |",
        "|---|---|---|---:|---:|",
    ]
    from .summary import op_time

    dev = str(m.get("device_type") or "cpu")
    for op in p.ops[:top]:
        lines.append(
            f"| `{op.name}` | {op.module or '-'} | {op.block} | {op.calls:.1f} | {us_text(op_time(op, dev))} |"
        )
    lines += ["", "## Findings", ""]
    if not p.findings:
        lines.append("None above the thresholds.")
    for f in p.findings:
        lines.append(
            f"- **{f.get('id')}** ({f.get('share') or 0:.1%} of the step): {f.get('title')}"
        )
        lines.append(
            f"  - threshold: {f.get('threshold')}; "
            f"evidence: {json.dumps(f.get('evidence'), default=str)[:300]}"
        )
    lines += ["", "## Recommendations", ""]
    if not p.recommendations:
        lines.append("None.")
    for i, r in enumerate(p.recommendations, 1):
        est = r.get("estimated_speedup")
        est_s = f"{est:.2f}x" if est else "not estimated"
        lines.append(f"{i}. **{r.get('title')}** (estimated {est_s}; {r.get('basis', '')})")
        lines.append(f"   - action: {r.get('action')}")
        if r.get("command"):
            lines.append(f"   - command: `{r['command']}`")
        if r.get("tile_search"):
            lines.append(f"   - tile shapes: `{r['tile_search']}`")
        if r.get("verify"):
            lines.append(f"   - verify: `{r['verify']}` then `pypto-tune compare BASE OPT`")
    for w in p.warnings:
        lines.append(f"\nWarning: {w}")
    return "\n".join(lines) + "\n"


def chrome_trace(p: Profile) -> dict[str, Any]:
    """Trace Event Format: steps, module scopes and operators as nested slices."""
    if p.trace is None:
        raise BadInputError(
            "this profile holds no raw trace (loaded from JSON): re-profile to get a trace"
        )
    t = p.trace
    events: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": 0,
            "args": {"name": f"pypto-tune ({t.backend})"},
        },
    ]
    # A step slice is the span profile.json's per-step time averages (summary.step_periods:
    # a decode step runs from its forward to the next step's), so a viewer measures the
    # step the report quotes (the raw forward marks read 4.6% shorter); each decode
    # step's forward mark stays inside it as "<name> (forward)".
    periods = step_periods(t, str(p.meta.get("regime") or ""))
    period_keys = {(s.name, s.start_us, s.thread) for s in periods}
    for s in periods:
        events.append(
            {
                "ph": "X",
                "name": s.name,
                "cat": "step",
                "pid": 0,
                "tid": s.thread,
                "ts": s.start_us,
                "dur": s.dur_us,
            }
        )
    for s in t.steps:
        forward = (s.name, s.start_us, s.thread) in period_keys
        if forward and not any(
            (q.name, q.start_us, q.thread) == (s.name, s.start_us, s.thread)
            and q.dur_us != s.dur_us
            for q in periods
        ):
            continue  # the mark is its own period (prefill, an iteration's last step)
        events.append(
            {
                "ph": "X",
                "name": f"{s.name} (forward)" if forward else s.name,
                "cat": "forward" if forward else "step",
                "pid": 0,
                "tid": s.thread,
                "ts": s.start_us,
                "dur": s.dur_us,
            }
        )
    for s in t.modules:
        events.append(
            {
                "ph": "X",
                "name": s.name,
                "cat": "module",
                "pid": 0,
                "tid": s.thread,
                "ts": s.start_us,
                "dur": s.dur_us,
            }
        )
    # A kernel fused across modules is split into one piece per module (its share of the
    # kernel's time); the pieces are laid end to end over the kernel's own span, so a
    # viewer sums them to the kernel's duration (they all started at the kernel's start,
    # overlapping, and read 3.9 ms per step for a kernel profile.json puts at 8.5 ms).
    laid: dict[tuple[str, float, int, str], float] = {}
    for e in t.events:
        args: dict[str, Any] = {"module": e.module}
        if e.shapes:
            args["shapes"] = e.shapes
        if e.core:
            args["core"] = e.core
        ts = e.start_us
        if e.extra.get("fused_across"):
            args["fused_across"] = e.extra["fused_across"]
            args["share"] = e.extra.get("share")
            args["kernel_ts"] = e.start_us
            key = (e.name, e.start_us, e.thread, e.kind)
            ts = e.start_us + laid.get(key, 0.0)
            laid[key] = laid.get(key, 0.0) + e.dur_us
        events.append(
            {
                "ph": "X",
                "name": e.name,
                "cat": e.kind,
                "pid": 0 if e.kind != "kernel" else 1,
                "tid": e.thread if e.kind != "kernel" else 0,
                "ts": ts,
                "dur": max(e.dur_us, 0.001),
                "args": args,
            }
        )
    if any(e.kind == "kernel" for e in t.events):
        events.append({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "device"}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(p: Profile, path: str | Path) -> Path:
    text = json.dumps(chrome_trace(p), default=str)
    return _write(Path(path), "Chrome trace", lambda fh: fh.write(text.encode("utf-8")))


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend, or the install hint."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EnvironmentMissingError(
            "plotting needs matplotlib: pip install 'pypto-tune[plot]'"
        ) from None
    return plt


def plot_blocks(p: Profile, path: str | Path) -> Path:
    """Horizontal bars of the per-step time by block type (matplotlib, the plot extra)."""
    plt = _pyplot()
    items = sorted(p.blocks.items(), key=lambda kv: kv[1]["us"])
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(items) + 1.5))
    ax.barh([k for k, _ in items], [v["us"] / 1000 for _, v in items])
    ax.set_xlabel("ms per step")
    m = p.meta
    ax.set_title(f"{(m.get('model') or {}).get('class', '')} {m.get('regime')} / {m.get('arm')}")
    fig.tight_layout()
    try:
        return _write(Path(path), "plot", lambda fh: fig.savefig(fh, format="png"))
    finally:
        plt.close(fig)


def plot_comparison(c: dict[str, Any], path: str | Path) -> Path:
    """Time by block of two profiles side by side (``compare_profiles``'s result): e.g.
    eager and graph, so what capture saved and what it left stand next to each other."""
    plt = _pyplot()
    items = sorted(c["blocks"].items(), key=lambda kv: max(kv[1]["base_us"], kv[1]["opt_us"]))
    names = [k for k, _ in items]
    ys = range(len(items))
    fig, ax = plt.subplots(figsize=(7.5, 0.5 * len(items) + 1.8))
    h = 0.4
    base, opt = c["base"].get("arm") or "base", c["opt"].get("arm") or "opt"
    ax.barh([y + h / 2 for y in ys], [v["base_us"] / 1000 for _, v in items], h, label=base)
    ax.barh([y - h / 2 for y in ys], [v["opt_us"] / 1000 for _, v in items], h, label=opt)
    ax.set_yticks(list(ys), names)
    ax.set_xlabel("ms per step")
    ax.set_title(f"time by block: {base} vs {opt}")
    ax.legend()
    fig.tight_layout()
    try:
        return _write(Path(path), "plot", lambda fh: fig.savefig(fh, format="png"))
    finally:
        plt.close(fig)


def write_page(
    p: Profile, path: str | Path, *, trace_href: str | None, profile_href: str | None
) -> Path:
    """The diagnosis page (:func:`pypto_tune.html_report.profile_to_html`), written the
    one way outputs are written."""
    from .html_report import profile_to_html

    page = profile_to_html(p, trace_href=trace_href, profile_href=profile_href).encode("utf-8")
    return _write(Path(path), "HTML report", lambda fh: fh.write(page))


#: torch.profiler's own Chrome trace of a one-process profile, in a folder of its own: trace
#: tools take a folder and read every JSON file in it as a trace (profile.json is not one).
TORCH_TRACE_NAME = "torch/trace.json"


def write_outputs(p: Profile, out: str | Path) -> dict[str, str]:
    """Everything for one profile in folder ``out``: profile.json, profile.md, report.html
    (the same diagnosis as one self-contained page), trace.json (when the raw trace is in
    memory), torch/trace.json (torch.profiler's own trace, on CPU and CUDA) and
    breakdown.png (when matplotlib is installed)."""
    import logging

    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputWriteError(
            f"cannot create the output folder {out} ({err.strerror or err}): "
            "name a writable folder with --out"
        ) from None
    written = {"profile": str(write_profile(p, out / "profile.json"))}
    md = to_markdown(p).encode("utf-8")
    written["markdown"] = str(
        _write(out / "profile.md", "Markdown report", lambda fh: fh.write(md))
    )
    if p.trace is not None:
        written["trace"] = str(write_chrome_trace(p, out / "trace.json"))
        if p.trace.native_export is not None:
            # The profiler's own trace beside ours, with ProfilerStep#<n> marks: what the
            # field's trace tools (Holistic Trace Analysis, Perfetto) read as they are.
            try:
                folder = (out / TORCH_TRACE_NAME).parent
                if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                    folder.unlink()  # a planted link or file: replaced, its target untouched
                folder.mkdir(exist_ok=True)
                written["torch_trace"] = str(p.trace.native_export(out / TORCH_TRACE_NAME))
            except OSError as err:
                raise OutputWriteError(
                    f"cannot write {out / TORCH_TRACE_NAME} ({err.strerror or err}): name a "
                    "writable folder with --out"
                ) from None
    written["html"] = str(
        write_page(
            p,
            out / "report.html",
            trace_href="trace.json" if "trace" in written else None,
            profile_href="profile.json",
        )
    )
    try:
        written["plot"] = str(plot_blocks(p, out / "breakdown.png"))
    except EnvironmentMissingError as err:
        logging.getLogger(__name__).warning("%s", err)
    return written
