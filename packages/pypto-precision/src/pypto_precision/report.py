"""A comparison written for people and scripts: compare.json, compare.md, compare.html.

The markdown and the page lead with the answer (pass, or the first diverging module and the
metric that decided it), then the rule with its constants, then every failing row, then the
whole table. The page is built with pypto-common's kit (every cell escaped, a CSP that loads
nothing) and plots the error of each output against what it was allowed, in execution order.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pypto_common import atomic_write_text
from pypto_common import html as H

from .compare import Comparison, Row

__all__ = ["render_html", "render_markdown", "summary_line", "write_reports"]

_MD_ROWS = 200


def _num(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    return f"{x:.4g}"


def summary_line(c: Comparison) -> str:
    """One line: the answer."""
    if c.ok:
        return (
            f"pass: {len(c.rows)} entries within the rule ({c.metric}, k={c.rule.k:g}"
            f"{', against the noise floor' if c.floor else ', no noise floor given'})"
        )
    first = c.first_divergent
    assert first is not None
    return (
        f"DIVERGED: {len(c.failed)} of {len(c.rows)} entries past the rule; the first "
        f"diverging module is {first.module} ({first.io} {first.id.rsplit('.', 1)[-1]}): "
        f"{first.verdict.why}"
    )


def _cols(r: Row) -> list[Any]:
    m = r.metrics
    return [r.order, r.module, r.io, "x".join(map(str, r.shape)), r.dtype,
            _num(m.get("cosine")), _num(m.get("max_abs")), _num(m.get("max_rel")),
            _num(r.verdict.value), _num(r.verdict.floor), _num(r.verdict.allowed),
            "pass" if r.verdict.ok else "FAIL"]  # fmt: skip


_HEAD = ["#", "module", "io", "shape", "dtype", "cosine", "max abs", "max rel", "error",
         "floor", "allowed", "verdict"]  # fmt: skip


def render_markdown(c: Comparison) -> str:
    lines = ["# Precision compare", "", f"**{summary_line(c)}**", ""]
    for side, d in (("target", c.target), ("reference", c.reference), ("noise floor", c.floor)):
        if d:
            lines.append(
                f"- {side}: `{d['folder']}` ({d['source']}, {d['mode']}; device {d['device']}, "
                f"dtype {d['dtype']}, arm {d['arm']}; {d['entries']} entries)"
            )
    lines += [
        "",
        f"Rule: error = `{c.metric}`; pass when error <= max(k x floor, the dtype's minimum) "
        f"with k = {c.rule.k:g}, or <= the dtype's default without a floor "
        f"(minimums {c.rule.min_allowed}, defaults {c.rule.default_allowed}); a non-finite "
        "value on one side only fails. See docs/precision.md.",
        "",
    ]
    worst = c.worst
    if worst is not None:
        lines += [f"Largest error against its allowance: {worst.module} ({worst.verdict.why}).", ""]
    if c.only_in_target or c.only_in_reference:
        lines += [
            f"Not compared: {len(c.only_in_target)} entries only in the target, "
            f"{len(c.only_in_reference)} only in the reference.",
            "",
        ]
    shown = c.failed[:_MD_ROWS] if c.failed else c.rows[:_MD_ROWS]
    title = "Failing entries" if c.failed else "Entries"
    lines += [f"## {title}", "", "| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]
    for r in shown:
        lines.append("| " + " | ".join(str(x).replace("|", "\\|") for x in _cols(r)) + " |")
    if len(c.failed or c.rows) > _MD_ROWS:
        lines += ["", f"({len(c.failed or c.rows) - _MD_ROWS} more in compare.json)"]
    return "\n".join(lines) + "\n"


def render_html(c: Comparison) -> str:
    kind = "ok" if c.ok else "bad"
    parts: list[Any] = [H.box([summary_line(c)], kind=kind, title="Verdict")]
    outputs = [r for r in c.rows if r.io == "output" and r.verdict.value is not None]

    def draw(fig: Any) -> None:
        ax = fig.subplots()
        xs = [r.order for r in outputs]
        ax.semilogy(xs, [max(r.verdict.value or 0.0, 1e-18) for r in outputs], ".", label="error")
        ax.semilogy(xs, [max(r.verdict.allowed or 0.0, 1e-18) for r in outputs], "-",
                    label="allowed", alpha=0.6)  # fmt: skip
        first = c.first_divergent
        if first is not None:
            ax.axvline(first.order, color="red", alpha=0.5, label=f"first: {first.module}"[:60])
        ax.set_xlabel("output, in execution order")
        ax.set_ylabel(c.metric)
        ax.legend(loc="best")

    if outputs and any(math.isfinite(r.verdict.value or 0.0) for r in outputs):
        parts.append(H.section("Error by module", H.svg_plot(draw)))
    rows = c.failed or c.rows
    parts.append(
        H.section(
            "Failing entries" if c.failed else "Entries",
            H.table(
                _HEAD,
                [_cols(r) for r in rows[:2000]],
                row_classes=[None if r.verdict.ok else "failed" for r in rows[:2000]],
            ),
        )
    )
    parts.append(
        H.section(
            "The rule",
            f"error = {c.metric}; pass when error <= max(k x floor, the dtype's minimum), "
            f"k = {c.rule.k:g}; minimums {c.rule.min_allowed}; without a floor, the dtype's "
            f"default {c.rule.default_allowed}; a non-finite value on one side only fails",
        )
    )
    subtitle = f"{c.target['folder']} vs {c.reference['folder']}"
    return H.page("Precision compare", parts, subtitle=subtitle)


def write_reports(c: Comparison, out: str | Path) -> dict[str, Path]:
    """compare.json, compare.md and compare.html in ``out`` (created); their paths."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": atomic_write_text(
            folder / "compare.json", json.dumps(c.to_dict(), indent=1, allow_nan=False)
        ),
        "markdown": atomic_write_text(folder / "compare.md", render_markdown(c)),
        "html": atomic_write_text(folder / "compare.html", render_html(c)),
    }
    return paths
