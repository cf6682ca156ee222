"""A diagnosis as one page: ``report.html`` beside ``profile.md``, read from the profile JSON.

What a reader of a diagnosis wants at a glance: where the step's time goes, which
operators cost most, what was found (with the evidence a threshold was crossed on) and
what to change, with an estimate and the exact command to copy. The page is built from
the versioned profile document only (a :class:`Profile` is turned into its redacted JSON
first), in one self-contained file that opens offline from a file:// URL
(:mod:`pypto_common.html`: no network, inline styles and SVG, every value escaped; the
paths and command lines in a profile come from the user's folders and are text here).
"""

from __future__ import annotations

import json
import math
import shlex
from typing import Any

from pypto_common import redact_obj
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

from .records import Profile
from .render import attribution_line, layer_times, us_text
from .summary import op_time

__all__ = ["PAGE_NAME", "profile_to_html"]

#: The page's file name, beside profile.md (``write_outputs``, ``advise --write``).
PAGE_NAME = "report.html"

#: Perfetto's UI: opens a Chrome trace file the reader drops on it (nothing is uploaded).
PERFETTO_URL = "https://ui.perfetto.dev"


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _dict(value: Any) -> dict[str, Any]:
    """``value`` where it is an object, else empty (a profile from a file is untrusted)."""
    return value if isinstance(value, dict) else {}


def _share(value: Any) -> str:
    got = _num(value)
    return "-" if got is None else f"{got:.1%}"


def _profile(profile: Profile | dict[str, Any]) -> Profile:
    """The profile as its document says (redacted), with typed operators for ``op_time``."""
    data = profile.to_dict() if isinstance(profile, Profile) else profile
    return Profile.from_dict(redact_obj(json.loads(json.dumps(data, default=str))))


def _step(p: Profile) -> Raw:
    step = p.step
    times = _dict(step.get("time_us"))
    crit = _dict(step.get("critical_path"))
    rows = [
        ["time per " + str(step.get("unit") or "step"), us_text(_num(p.step_us))],
        [
            "median / stdev",
            f"{us_text(_num(times.get('median')))} / {us_text(_num(times.get('stdev')))}",
        ],
        ["device busy", us_text(_num(step.get("device_busy_us")))],
        ["host gaps", us_text(_num(step.get("host_gap_us")))],
        ["utilisation", _share(step.get("utilisation"))],
        ["bound by", f"the {crit.get('bound', '?')}"],
        ["host syncs per step", f"{_num(step.get('host_syncs')) or 0:.1f}"],
        ["steps profiled", str(step.get("count"))],
    ]
    if p.peaks:
        flops = _num(p.peaks.get("matmul_flops_per_s")) or 0.0
        bw = _num(p.peaks.get("bandwidth_bytes_per_s")) or 0.0
        rows.append(
            [
                "peaks measured here",
                f"matmul {flops / 1e12:.3f} TFLOP/s, bandwidth {bw / 1e9:.1f} GB/s",
            ]
        )
    return table(["measure", "value"], rows, classes="facts", id="step")


def _blocks(p: Profile) -> list[Raw]:
    items = sorted(
        ((str(k), v) for k, v in p.blocks.items() if isinstance(v, dict)),
        key=lambda kv: -(_num(kv[1].get("us")) or 0.0),
    )
    rows = [[name, us_text(_num(b.get("us"))), _share(b.get("share"))] for name, b in items]
    shown = [(name, (_num(b.get("us")) or 0.0) / 1000) for name, b in items][:16]

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        names = [n[:32] for n, _ in reversed(shown)]
        ax.barh(names, [ms for _, ms in reversed(shown)], color="#4c78a8")
        ax.set_xlabel(f"ms per {p.step.get('unit') or 'step'}")
        ax.grid(axis="x", alpha=0.3)

    plot = (
        svg_plot(
            draw,
            size=(9.0, 0.35 * len(shown) + 1.2),
            caption="time per step by block type (the module an operator ran in decides its block)",
        )
        if shown
        else Raw('<p class="note">No block timed: nothing to plot.</p>')
    )
    return [plot, table(["block", "per step", "share"], rows, id="blocks")]


def _layers(p: Profile, top: int) -> Raw | None:
    layers = layer_times(p)
    if not layers:
        return None
    step = p.step_us
    rows = [
        [str(layer), us_text(us), f"{us / step:.1%}" if step else "-"]
        for layer, us in sorted(layers.items(), key=lambda kv: -kv[1])[:top]
    ]
    return table(["layer", "per step", "share"], rows, id="layers")


def _ops(p: Profile, top: int) -> Raw:
    dev = str(p.meta.get("device_type") or "cpu")
    rows = [
        [
            Raw(f"<code>{esc(op.name)}</code>"),
            op.module or "-",
            op.block,
            f"{_num(op.calls) or 0:.1f}",
            us_text(_num(op_time(op, dev))),
        ]
        for op in p.ops[:top]
    ]
    return table(["operator", "module", "block", "calls/step", "time/step"], rows, id="operators")


def _evidence(value: Any) -> Raw:
    """A finding's evidence as key/value pairs (nested values as compact JSON, clipped)."""
    if not isinstance(value, dict):
        return tag("p", json.dumps(value, default=str))
    items = []
    for key, v in value.items():
        if isinstance(v, float):
            shown = f"{v:.4g}"
        elif isinstance(v, (dict, list)):
            shown = json.dumps(v, default=str)
        else:
            shown = str(v)
        items.append(f"<dt>{esc(key)}</dt><dd>{esc(shown, limit=600)}</dd>")
    return Raw(f'<dl class="kv">{"".join(items)}</dl>')


def _findings(p: Profile) -> list[Raw]:
    if not p.findings:
        return [box(["None above the thresholds."], kind="ok")]
    cards = []
    for f in p.findings:
        if not isinstance(f, dict):
            continue
        where = f.get("where") or []
        parts = [
            tag("h3", f"{f.get('id')}: {f.get('title')}"),
            tag(
                "p",
                f"{_share(f.get('share'))} of the step; threshold: ",
                json.dumps(f.get("threshold"), default=str),
            ),
            tag("p", "Evidence:"),
            _evidence(f.get("evidence")),
        ]
        if isinstance(where, list) and where:
            parts.append(
                tag(
                    "p",
                    "Where: ",
                    ", ".join(str(w) for w in where[:12]) + (" ..." if len(where) > 12 else ""),
                )
            )
        cards.append(tag("div", *parts, cls="card finding"))
    return cards


def _recommendations(p: Profile) -> list[Raw]:
    if not p.recommendations:
        return [Raw("<p>None.</p>")]
    cards = []
    for i, r in enumerate(p.recommendations, 1):
        if not isinstance(r, dict):
            continue
        est = _num(r.get("estimated_speedup"))
        est_s = f"estimated {est:.2f}x" if est else "not estimated"
        parts = [
            tag("h3", f"{i}. {r.get('title')}"),
            Raw(f'<p><span class="badge ok">{esc(est_s)}</span> {esc(r.get("basis", ""))}</p>'),
            tag("p", "Action: ", str(r.get("action"))),
        ]
        if r.get("command"):
            parts += [tag("p", "Command:"), command_block(str(r["command"]))]
        if r.get("tile_search"):
            parts += [tag("p", "Tile shapes:"), command_block(str(r["tile_search"]))]
        if r.get("verify"):
            parts += [
                tag("p", "Verify (then pypto-tune compare BASE OPT):"),
                command_block(str(r["verify"])),
            ]
        cards.append(tag("div", *parts, cls="card recommendation"))
    return cards


def _glance(p: Profile) -> Raw:
    best = next((r for r in p.recommendations if isinstance(r, dict)), None)
    text = f"{us_text(_num(p.step_us))} per {p.step.get('unit') or 'step'}; {len(p.findings)} finding(s)"
    if best is not None and _num(best.get("estimated_speedup")):
        text += f"; best advice: {best.get('title')} (estimated {best['estimated_speedup']:.2f}x)."
    else:
        text += "; no recommendation above the thresholds."
    return Raw(f'<p class="glance">{esc(text)}</p>')


def profile_to_html(
    profile: Profile | dict[str, Any],
    *,
    trace_href: str | None = "trace.json",
    profile_href: str | None = "profile.json",
    top: int = 15,
) -> str:
    """The diagnosis as one self-contained HTML page.

    ``trace_href`` / ``profile_href``: the Chrome trace and the profile JSON relative to
    the page (None: not linked, e.g. a profile loaded from JSON has no trace).
    """
    p = _profile(profile)
    m = p.meta
    model = _dict(m.get("model"))
    title = f"pypto-tune diagnosis: {model.get('class') or 'model'}, {m.get('regime')} / {m.get('arm')} arm"
    env = (
        f"Device {m.get('device')} ({m.get('dtype')}), profiler {m.get('profiler')} "
        f"({m.get('level')}), batch {m.get('batch')}, seq {m.get('seq')}, gen {m.get('gen')}, "
        f"torch {m.get('torch')}; model folder {model.get('path')}"
    )
    sections: list[Any] = [Raw(f'<p class="sub" id="environment">{esc(env)}</p>'), _glance(p)]
    if p.warnings:
        sections.append(box([str(w) for w in p.warnings], kind="warn", title="Warnings"))
    sections.append(section("Step", _step(p), id="step-section"))
    sections.append(section("Time by block", *_blocks(p), id="blocks-section"))
    layers = _layers(p, top)
    if layers is not None:
        sections.append(section("Time by layer", layers))
    attribution = m.get("attribution")
    if isinstance(attribution, dict):
        sections.append(section("Inside the captured step", attribution_line(attribution)))
    sections.append(section(f"Top {top} operators", _ops(p, top), id="operators-section"))
    sections.append(section("Findings", *_findings(p), id="findings"))
    sections.append(section("Recommendations", *_recommendations(p), id="recommendations"))
    argv = m.get("command_line")
    if isinstance(argv, list) and argv:
        sections.append(section("Command", command_block(shlex.join(str(a) for a in argv))))
    files = []
    if trace_href:
        files.append(
            tag(
                "li",
                link(trace_href, "the Chrome trace"),
                " (module scopes and operators as a flame chart: open it in ",
                link(PERFETTO_URL, PERFETTO_URL),
                ", which reads it in the browser)",
            )
        )
    if profile_href:
        files.append(
            tag("li", link(profile_href, "the profile JSON"), " (every figure on this page)")
        )
    if files:
        sections.append(section("Files", tag("ul", *files), id="files"))
    data = p.to_dict()
    sections.append(
        Raw(
            f"<footer>Written by pypto-tune from profile schema {esc(data.get('schema_version'))}, "
            f"profiled at {esc(m.get('created'))}; this page loads nothing from the network.</footer>"
        )
    )
    return page(title, sections)
