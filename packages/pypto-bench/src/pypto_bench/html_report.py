"""A run as one page: ``report.html``, self-contained, read from the report JSON only.

People reading a throughput report would rather look than read: which arm is fastest and
by how much (with its interval), how close to the roofline, what went wrong. The page
shows at least what the markdown shows (the same builders of :mod:`pypto_bench.report`
make its cells and lines), plus a plot of each arm's tok/s against the ceilings, in one
file that opens offline from a file:// URL (:mod:`pypto_common.html`: no network, inline
styles and SVG, every value escaped).

The page is drawn from the report *document* (a :class:`Report` is turned into its
redacted JSON first), so a page written now and one rendered later from the saved JSON
are the same page.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
import secrets
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pypto_common import atomic_write_text, redact, redact_obj
from pypto_common.html import (
    Raw,
    box,
    command_block,
    esc,
    link,
    page,
    section,
    svg_plot,
    table,
    tag,
)

from .config import Arm
from .errors import ReportPathError, ReportWriteError
from .report import (
    DIFFUSION_HEADERS,
    SWEEP_HEADERS,
    Report,
    arm_rows,
    check_report_path,
    diffusion_rows,
    distributed_lines,
    failure_lines,
    fallback_dirs,
    headers,
    interval_text,
    kv_cache_line,
    memory_note,
    mitigations_line,
    noise_lines,
    numerics_line,
    reference_line,
    schedule_lines,
    step_latency_line,
    sweep_rows,
    vl_line,
)

__all__ = ["ARMS_TABLE_ID", "check_html_path", "report_to_html", "write_html"]

log = logging.getLogger(__name__)

#: The arms table's element id (tests and readers' scripts find the table by it).
ARMS_TABLE_ID = "arms"


def _data(report: Report | dict[str, Any]) -> dict[str, Any]:
    """The report document, redacted (a dict from a file is redacted again: cheap, and
    the page must never be where a token first shows)."""
    if isinstance(report, Report):
        return report.to_dict()
    return redact_obj(report)


def _num(value: Any) -> float | None:
    """A finite number from the document, else None (a report from a file is untrusted)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _fmt(value: Any, spec: str = ".1f") -> str:
    got = _num(value)
    return "-" if got is None else format(got, spec)


# --------------------------------------------------------------------------- sections


def _identity(data: dict[str, Any]) -> list[str]:
    """The environment line of the markdown: model, device, shapes, versions, host."""
    cfg, env, model = (
        data.get("config") or {},
        data.get("environment") or {},
        data.get("model") or {},
    )
    device = env.get("device") or {}
    versions = env.get("versions") or {}
    run = (
        f"{model.get('class', '?')} ({model.get('dtype', cfg.get('dtype'))}) on "
        f"{device.get('name')} ({device.get('spec')}), regime {data.get('regime')}, "
        f"batch {cfg.get('batch')}, seq {cfg.get('seq')}, gen {cfg.get('gen')}, warmup "
        f"{cfg.get('warmup')}, iters {cfg.get('iters')}, graph backend {cfg.get('graph_backend')}"
    )
    soft = f"torch {versions.get('torch')}, transformers {versions.get('transformers')}"
    if versions.get("torch_npu"):
        soft += f", torch_npu {versions['torch_npu']}"
    if versions.get("cann"):
        soft += f", CANN {versions['cann']}"
    soft += f"; host {env.get('host')}"
    if env.get("cpu"):
        soft += f" ({env.get('cpu')}, {env.get('cpu_threads')} threads)"
    where = f"model folder {model.get('path')}"
    if model.get("model_type"):
        where += f" (model_type {model.get('model_type')})"
    return [run, soft, where]


def _glance(data: dict[str, Any]) -> Raw:
    """The run in one line: verdict badges and the fastest arm against eager."""
    arms = [a for a in data.get("arms") or [] if isinstance(a, dict)]
    ok = [a for a in arms if a.get("ok")]
    badges = [
        tag("span", "all arms ok", cls="badge ok")
        if data.get("ok")
        else tag(
            "span",
            f"FAILED: {', '.join(str(a.get('name')) for a in arms if not a.get('ok'))}",
            cls="badge bad",
        )
    ]
    wrong = [str(a.get("name")) for a in arms if (a.get("numerics") or {}).get("verdict") == "fail"]
    if wrong:
        allowed = any((a.get("numerics") or {}).get("allowed_by_user") for a in arms)
        badges.append(
            tag(
                "span",
                f"NUMERICS FAIL: {', '.join(wrong)} (ratios not comparable"
                + ("; allowed by --allow-inaccurate)" if allowed else ")"),
                cls="badge bad",
            )
        )
    # The fastest arm is quoted from the arms whose numbers are right.
    ok = [a for a in ok if str(a.get("name")) not in wrong]
    if (data.get("noise") or {}).get("noisy"):
        badges.append(tag("span", "NOISY: see the noise verdicts", cls="badge warn"))
    best = max(
        ok, key=lambda a: _num((a.get("tokens_per_s") or {}).get("best")) or 0.0, default=None
    )
    words = ""
    if best is not None:
        tps = (best.get("tokens_per_s") or {}).get("best")
        words = f"Fastest: {best.get('name')} at {_fmt(tps)} tok/s (best)"
        ratio = interval_text(best.get("ratio_vs_eager"))
        if best.get("name") == Arm.EAGER:
            words += ", the reference arm itself"
        elif ratio:
            words += f", {ratio} x eager (median [95% interval])"
        elif _num(best.get("ratio_to_eager")):
            words += f", {_fmt(best.get('ratio_to_eager'), '.2f')} x eager"
        roof = _num((best.get("roofline") or {}).get("fraction_of_ceiling"))
        if roof is not None:
            words += f", {roof * 100:.1f}% of its roofline ceiling"
        if best.get("unreliable"):
            words += " (UNRELIABLE: the noise guard marked it)"
        words += "."
    else:
        words = "No arm finished: nothing was measured."
    return Raw(f'<p class="glance">{" ".join(badges)} {esc(words)}</p>')


def _attention(data: dict[str, Any]) -> list[Raw]:
    """Failed arms, noise verdicts and warnings: boxes near the top, in plain sight."""
    out: list[Raw] = []
    arms = [a for a in data.get("arms") or [] if isinstance(a, dict)]
    failed: list[str] = []
    for arm in arms:
        if arm.get("ok"):
            continue
        failed += [f"{arm.get('name')}: {line}" for line in failure_lines(arm)]
    # A sweep's first batch is the headline arms above; the other batches' failures here.
    for entry in (data.get("batch_sweep") or [])[1:]:
        for arm in (entry or {}).get("arms") or []:
            if isinstance(arm, dict) and not arm.get("ok"):
                failed.append(f"{arm.get('name')} (batch {entry.get('batch')}): {arm.get('error')}")
    if failed:
        out.append(box(failed, kind="bad", title="Failed arms"))
    # Split by the verdict itself, not by the words of its line (a "why" may say anything).
    bad: list[str] = []
    fine: list[str] = []
    for a in arms:
        line = numerics_line(a)
        if line:
            failing = (a.get("numerics") or {}).get("verdict") == "fail"
            (bad if failing else fine).append(f"{a.get('name')}: {line}")
    if bad:
        out.append(box(bad, kind="bad", title="Numerics: arms that compute something else"))
    check = data.get("reference_check")
    ref_line = reference_line(check if isinstance(check, dict) else None)
    ref_failed = isinstance(check, dict) and check.get("verdict") == "fail"
    if ref_line and ref_failed:
        out.append(box([f"eager: {ref_line}"], kind="bad", title="Numerics: the reference device"))
    noise = noise_lines(data)
    if noise:
        out.append(box(noise, kind="warn", title="Noise verdicts"))
    warnings = [str(w) for w in data.get("warnings") or []]
    warnings += [f"{a.get('name')}: {w}" for a in arms for w in a.get("warnings") or []]
    # The noise summary is also a report warning: shown once, in the noise box.
    warnings = [w for w in warnings if not any(w in line for line in noise)]
    if warnings:
        out.append(box(warnings, kind="warn", title="Warnings"))
    if not out:
        out.append(box(["no failed arm, no noise verdict, no warning"], kind="ok"))
    if fine:
        out.append(box(fine, kind="ok", title="Numerics (each arm against eager)"))
    if ref_line and not ref_failed:
        out.append(box([f"eager: {ref_line}"], kind="ok", title="Numerics: the reference device"))
    return out


def _arms_table(data: dict[str, Any]) -> Raw:
    """The markdown's arm table; the median cell carries its 95% interval where known."""
    head = headers(data)
    rows = arm_rows(data)
    arms = [a for a in data.get("arms") or [] if isinstance(a, dict)]
    col = head.index("median") if "median" in head else None
    if col is not None:
        head = [*head]
        head[col] = "median [95% interval]"
        for row, arm in zip(rows, arms, strict=False):
            got = interval_text((arm.get("tokens_per_s") or {}).get("interval"), ".1f")
            if got:
                row[col] = got
    marks = [
        "failed" if not a.get("ok") else ("unreliable" if a.get("unreliable") else None)
        for a in arms
    ]
    return table(head, rows, id=ARMS_TABLE_ID, classes="arms", row_classes=marks)


def _ceilings(arms: Sequence[dict[str, Any]]) -> tuple[float | None, float | None]:
    """The bandwidth and compute ceilings (tok/s) the arms share in one run."""
    bw = cp = None
    for arm in arms:
        roof = arm.get("roofline") or {}
        bw = bw or _num(roof.get("bandwidth_ceiling_tok_s")) or _num(roof.get("ceiling_tok_s"))
        cp = cp or _num(roof.get("compute_ceiling_tok_s"))
    return bw, cp


def _bars(data: dict[str, Any]) -> Raw:
    """Each finished arm's tok/s (median with its interval, best marked) under the
    bandwidth and compute ceilings; log scale when a ceiling is far above the bars."""
    arms = [a for a in data.get("arms") or [] if isinstance(a, dict)]
    names: list[str] = []
    medians: list[float] = []
    lows: list[float] = []
    highs: list[float] = []
    bests: list[float] = []
    shares: list[float | None] = []
    for arm in arms:
        tps = arm.get("tokens_per_s") or {}
        med = _num(tps.get("median")) or _num(tps.get("best"))
        if not arm.get("ok") or med is None or med <= 0:
            continue
        ival = tps.get("interval") or {}
        names.append(str(arm.get("name"))[:24])
        medians.append(med)
        lows.append(max(med - (_num(ival.get("low")) or med), 0.0))
        highs.append(max((_num(ival.get("high")) or med) - med, 0.0))
        bests.append(_num(tps.get("best")) or med)
        shares.append(_num((arm.get("roofline") or {}).get("fraction_of_ceiling")))
    if not names:
        return Raw('<p class="note">No arm finished: nothing to plot.</p>')
    bw, cp = _ceilings(arms)

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        xs = list(range(len(names)))
        ax.bar(xs, medians, yerr=[lows, highs], capsize=4, color="#4c78a8", label="median tok/s")
        ax.scatter(xs, bests, marker="_", s=400, color="#1b1f24", zorder=3, label="best")
        ax.set_xticks(xs, names)
        top = max(bests + [m + h for m, h in zip(medians, highs, strict=True)])
        if bw:
            ax.axhline(bw, color="#cf222e", linestyle="--", label=f"bandwidth ceiling {bw:,.0f}")
        if cp:
            ax.axhline(cp, color="#8250df", linestyle=":", label=f"compute ceiling {cp:,.0f}")
        ceiling = max([c for c in (bw, cp) if c] or [top])
        if ceiling / max(min(medians), 1e-9) > 20:
            ax.set_yscale("log")
        for x, share in zip(xs, shares, strict=True):
            if share is not None:
                ax.annotate(
                    f"{share * 100:.1f}% of ceiling",
                    (x, medians[x] + highs[x]),
                    textcoords="offset points",
                    xytext=(0, 4),
                    ha="center",
                    fontsize=8,
                )
        ax.set_ylabel("tokens / s")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="best")

    return svg_plot(
        draw,
        size=(10.0, 4.0),
        caption="tok/s per arm: bar = median with its 95% interval, dash = best; the "
        "dashed lines are the roofline ceilings (what memory bandwidth / matmul peak allow)",
    )


def _kl_plot(data: dict[str, Any]) -> Raw | None:
    """The numerical gate's KL per teacher-forced step, one line per judged arm (and the
    reference-device check), log scale; None when no arm carries per-step values."""
    series: dict[str, list[float]] = {}
    for arm in data.get("arms") or []:
        if not isinstance(arm, dict):
            continue
        metrics = ((arm.get("numerics") or {}).get("metrics")) or {}
        steps = [v for v in (metrics.get("kl_steps") or []) if _num(v) is not None]
        if steps:
            series[f"{arm.get('name')}"[:24] + " vs eager"] = steps
    check = data.get("reference_check")
    if isinstance(check, dict):
        steps = [
            v for v in ((check.get("metrics") or {}).get("kl_steps") or []) if _num(v) is not None
        ]
        if steps:
            series[f"eager vs {check.get('device')}"[:32]] = steps
    if not series:
        return None

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        for name, steps in series.items():
            ax.plot(range(1, len(steps) + 1), [max(float(v), 1e-30) for v in steps],
                    marker="o", label=name)  # fmt: skip
        ax.set_yscale("log")
        ax.set_xlabel("teacher-forced step (or position)")
        ax.set_ylabel("KL (nats)")
        ax.legend(loc="best")

    return svg_plot(draw, size=(8.0, 3.2), caption="KL of each arm's logits per step")


def _sweep_plot(data: dict[str, Any]) -> Raw:
    """``--batch 1,8,32``: tok/s against batch per arm, with both ceilings per batch."""
    sweep = [e for e in data.get("batch_sweep") or [] if isinstance(e, dict)]
    series: dict[str, list[tuple[float, float]]] = {}
    bw_line: list[tuple[float, float]] = []
    cp_line: list[tuple[float, float]] = []
    for entry in sweep:
        batch = _num(entry.get("batch"))
        if batch is None:
            continue
        arms = [a for a in entry.get("arms") or [] if isinstance(a, dict)]
        for arm in arms:
            med = _num((arm.get("tokens_per_s") or {}).get("median"))
            if arm.get("ok") and med:
                series.setdefault(str(arm.get("name"))[:24], []).append((batch, med))
        bw, cp = _ceilings(arms)
        if bw:
            bw_line.append((batch, bw))
        if cp:
            cp_line.append((batch, cp))
    if not series:
        return Raw('<p class="note">No arm finished at any batch: nothing to plot.</p>')

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        for name, points in series.items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        if bw_line:
            ax.plot(*zip(*bw_line, strict=True), "--", color="#cf222e", label="bandwidth ceiling")
        if cp_line:
            ax.plot(*zip(*cp_line, strict=True), ":", color="#8250df", label="compute ceiling")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel("tokens / s (median)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    return svg_plot(
        draw,
        size=(10.0, 4.2),
        caption="batch sweep: each arm's median tok/s against the batch, under the "
        "bandwidth and compute ceilings of each batch (the lower one binds)",
    )


def _roofline(data: dict[str, Any]) -> list[Raw | str]:
    """The markdown's roofline sentence, then the plot."""
    parts: list[Raw | str] = []
    roof = data.get("roofline") or {}
    bw = _num(roof.get("bandwidth_bytes_per_s"))
    if bw:
        text = (
            f"Roofline: measured bandwidth {bw / 1e9:.1f} GB/s, weights "
            f"{(_num(roof.get('weight_bytes')) or 0) / 2**20:.1f} MiB read per step, KV "
            f"{roof.get('kv_bytes_per_token')} B/token"
        )
        flops = _num(roof.get("matmul_flops_per_s"))
        text += f", measured matmul peak {flops / 1e9:.1f} GFLOP/s." if flops else "."
        parts.append(text)
    else:
        parts.append("Roofline: no measured bandwidth in this report (no ceiling to compare with).")
    parts.append(_sweep_plot(data) if data.get("batch_sweep") else _bars(data))
    return parts


def _details_lines(data: dict[str, Any]) -> list[str]:
    """KV/state cache, mitigations, memory note, VL, outputs differing by design."""
    lines: list[str] = []
    arms = [a for a in data.get("arms") or [] if isinstance(a, dict)]
    for arm in arms:
        for line in (kv_cache_line(arm), mitigations_line(arm), step_latency_line(arm)):
            if line:
                lines.append(f"{arm.get('name')}: {line}")
        if arm.get("outputs_differ_by_design"):
            lines.append(
                f"{arm.get('name')}: outputs differ by design ({arm['outputs_differ_by_design']})"
            )
    note = memory_note(data)
    if note:
        lines.append(note)
    vl = vl_line(data)
    if vl:
        lines.append(vl)
    return lines


def _noise_checks(data: dict[str, Any]) -> Raw | None:
    """For a noisy run, every check the noise guard made (the markdown's table)."""
    noise = data.get("noise") or {}
    if not noise:
        return None
    if not noise.get("noisy"):
        return Raw("<p>Noise guard: no condition held (spread, roofline share, machine load).</p>")
    rows = [
        [
            c.get("name"),
            c.get("where"),
            c.get("measure"),
            _fmt(c.get("value"), ".2f"),
            _fmt(c.get("threshold"), "g"),
            "HOLDS" if c.get("holds") else "ok",
        ]
        for c in noise.get("checks") or []
        if isinstance(c, dict)
    ]
    marks = ["unreliable" if r[-1] == "HOLDS" else None for r in rows]
    parts = [
        table(
            ["condition", "where", "measure", "value", "threshold", "verdict"],
            rows,
            id="noise",
            row_classes=marks,
        )
    ]
    if noise.get("suggestion"):
        parts.append(tag("p", f"What to do: {noise['suggestion']}"))
    return Raw("".join(parts))


def _links(data: dict[str, Any], json_href: str | None, links: Sequence[tuple[str, str]]) -> Raw:
    items = []
    if json_href:
        items.append(
            tag(
                "li",
                link(json_href, "the report JSON"),
                " (every figure, schema ",
                str(data.get("schema_version")),
                ")",
            )
        )
    else:
        items.append(
            tag(
                "li",
                "the report JSON was not written to a file (pypto-bench run --report-file FILE)",
            )
        )
    for text, href in links:
        items.append(tag("li", link(href, text)))
    return tag("ul", *items)


def report_to_html(
    report: Report | dict[str, Any],
    *,
    json_href: str | None = None,
    links: Sequence[tuple[str, str]] = (),
) -> str:
    """The run as one self-contained HTML page.

    ``json_href``: the report JSON's path relative to the page (linked when given);
    ``links``: more ``(text, relative href)`` pairs (pypto-e2e links the diagnosis page).
    Everything else on the page comes from the report document.
    """
    data = _data(report)
    model = data.get("model") or {}
    title = f"pypto-bench: {model.get('class') or 'model'}, {data.get('regime')}"
    ident = _identity(data)
    sections: list[Any] = [
        Raw(f'<p class="sub" id="environment">{"<br>".join(esc(line) for line in ident)}</p>'),
        _glance(data),
        *_attention(data),
        section(
            "Arms",
            _arms_table(data),
            Raw(
                '<p class="note">x eager / x hf-compile: the median of the per-round paired '
                "ratios with its 95% interval; roofline %: measured tok/s over the lower "
                "ceiling; noise: the noise guard's verdict.</p>"
            ),
            id="arms-section",
        ),
    ]
    diffusion = diffusion_rows(data)
    if diffusion:
        sections.append(section("Diffusion generation", table(DIFFUSION_HEADERS, diffusion)))
    kl = _kl_plot(data)
    if kl is not None:
        sections.append(section("Numerics per step", kl, id="numerics"))
    sections.append(section("Roofline", *_roofline(data), id="roofline"))
    sweep = sweep_rows(data)
    if sweep:
        marks = [
            "failed" if r[2] == "FAILED" else ("unreliable" if r[-1] == "UNRELIABLE" else None)
            for r in sweep
        ]
        sections.append(
            section(
                "Batch sweep",
                "The decode roofline against both ceilings; binds = the lower one.",
                table(SWEEP_HEADERS, sweep, id="sweep", row_classes=marks),
            )
        )
    sched = schedule_lines(data)
    if sched:
        sections.append(
            section("Schedule and intervals", tag("ul", *(tag("li", s) for s in sched)))
        )
    checks = _noise_checks(data)
    if checks is not None:
        sections.append(section("Noise guard", checks, id="noise-section"))
    dist = distributed_lines(data)
    if dist:
        sections.append(section("Ranks", tag("pre", "\n".join(dist))))
    more = _details_lines(data)
    if more:
        sections.append(
            section("Cache and capture", tag("ul", *(tag("li", s) for s in more)), id="cache")
        )
    argv = data.get("command_line")
    if isinstance(argv, list) and argv:
        sections.append(
            section(
                "Command",
                command_block(shlex.join(str(a) for a in argv)),
                id="command",
            )
        )
    sections.append(section("Files", _links(data, json_href, links), id="files"))
    tool = data.get("tool") or {}
    sections.append(
        Raw(
            f"<footer>Written by {esc(tool.get('name'))} {esc(tool.get('version'))} from report "
            f"schema {esc(data.get('schema_version'))}, run at {esc(data.get('created_at'))}; "
            "this page loads nothing from the network.</footer>"
        )
    )
    return page(title, sections)


# --------------------------------------------------------------------------- writing


def check_html_path(path: str | Path) -> Path:
    """Fail before the run (not after minutes of benchmarking) if ``--html`` is unwritable."""
    return check_report_path(path, flag="--html", example="report.html")


def _href(target: Path | None, page_path: Path) -> str | None:
    if target is None:
        return None
    return os.path.relpath(Path(target).resolve(), page_path.resolve().parent)


def write_html(
    report: Report | dict[str, Any],
    path: str | Path,
    *,
    json_path: str | Path | None = None,
    links: Sequence[tuple[str, str]] = (),
    fallback: bool = True,
) -> Path:
    """Write the page atomically; return where it went.

    Like the report itself (:func:`pypto_bench.report.write_report`), a page that cannot
    be written where asked goes to ``$TMPDIR/pypto-bench-report-<timestamp>-*.html``
    (else the cwd), with a warning naming it: compare the returned path with ``path``.
    ``ReportWriteError`` when no place takes it (``ReportPathError`` with ``fallback``
    off). ``json_path``: the report JSON, linked relative to wherever the page lands.
    """
    target = Path(path).expanduser()
    json_target = Path(json_path) if json_path is not None else None
    try:
        check_html_path(target)
        atomic_write_text(
            target, report_to_html(report, json_href=_href(json_target, target), links=links)
        )
        return target
    except (OSError, ReportPathError) as err:
        reason = redact(
            str(err)
            if isinstance(err, ReportPathError)
            else f"writing the page {target} failed: {err.strerror or err}"
        )
        if not fallback:
            if isinstance(err, ReportPathError):
                raise
            raise ReportPathError(f"{reason}: pick another --html") from err
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        problems: list[str] = []
        for folder in fallback_dirs():
            spot = folder / f"pypto-bench-report-{stamp}-{secrets.token_hex(4)}.html"
            try:
                atomic_write_text(
                    spot, report_to_html(report, json_href=_href(json_target, spot), links=links)
                )
            except OSError as again:
                problems.append(f"{folder}: {again.strerror or again}")
                continue
            log.warning("%s; the page was saved to %s instead", reason, spot)
            return spot
        raise ReportWriteError(
            f"{reason}; no fallback folder took the page either ({'; '.join(problems)}): "
            "free disk space or pass a writable --html (the JSON report is unaffected)"
        ) from err
