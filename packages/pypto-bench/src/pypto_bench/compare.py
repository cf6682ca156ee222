"""Comparing reports, and the bar-chart plot.

Ratios between reports only mean something for the same regime on the same machine:
decode tok/s next to prefill tok/s (the seed's mistake) or a laptop next to an NPU
server is refused unless the caller says ``force``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import BadInputError, CompareMismatchError, EnvironmentMissingError
from .intervals import unpaired_ratio
from .noise import summary as noise_summary
from .report import Report, interval_text, load_report

__all__ = [
    "Comparison",
    "compare",
    "machine_of",
    "peak_memory",
    "plot",
]


def _data(r: Report | dict[str, Any] | str | Path) -> dict[str, Any]:
    if isinstance(r, Report):
        return r.to_dict()
    if isinstance(r, (str, Path)):
        return load_report(r)
    return r


def machine_of(data: dict[str, Any]) -> str:
    env = data["environment"]
    return f"{env.get('host')} / {env.get('device', {}).get('name')}"


def _label(data: dict[str, Any], index: int) -> str:
    model = (data.get("model") or {}).get("class") or "?"
    return f"#{index + 1} {model} {data['config'].get('dtype')} b{data['config'].get('batch')}"


@dataclass
class Comparison:
    """Rows of (report, arm, best tok/s, ratio to the first report's same arm, ratio to eager)."""

    regime: str
    labels: list[str]
    machines: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    forced: bool = False
    mismatches: list[str] = field(default_factory=list)
    #: One line per report marked noisy by its noise guard (its ratios are unreliable).
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "regime": self.regime,
            "labels": self.labels,
            "machines": self.machines,
            "rows": self.rows,
            "forced": self.forced,
            "mismatches": self.mismatches,
            "warnings": self.warnings,
        }

    def to_markdown(self) -> str:
        head = (
            "| report | arm | status | tok/s best | x first report | x eager | peak MiB | noise |"
        )
        lines = [f"Regime: **{self.regime}**", "", head, "|---|---|---|---|---|---|---|---|"]
        for r in self.rows:
            lines.append(
                f"| {r['report']} | {r['arm']} | {'ok' if r['ok'] else 'FAILED'} | "
                f"{_f(r['best_tok_s'], '.1f')} | {_ratio(r, 'ratio_vs_first', 'ratio_to_first')} | "
                f"{_ratio(r, 'ratio_vs_eager', 'ratio_to_eager')} | {_peak(r)} | {_noise(r)} |"
            )
        if self.mismatches:
            lines += ["", *[f"- forced despite: {m}" for m in self.mismatches]]
        if self.warnings:
            lines += ["", *[f"- warning: {w}" for w in self.warnings]]
        return "\n".join(lines) + "\n"

    def to_text(self) -> str:
        rows = [
            ["report", "arm", "status", "tok/s best", "x first", "x eager", "peak MiB", "noise"]
        ]
        for r in self.rows:
            rows.append(
                [
                    r["report"],
                    r["arm"],
                    "ok" if r["ok"] else "FAILED",
                    _f(r["best_tok_s"], ".1f"),
                    _ratio(r, "ratio_vs_first", "ratio_to_first"),
                    _ratio(r, "ratio_vs_eager", "ratio_to_eager"),
                    _peak(r),
                    _noise(r),
                ]
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
        )


def _samples(arm: dict[str, Any]) -> list[float]:
    return list((arm.get("tokens_per_s") or {}).get("samples") or [])


def _ratio(row: dict[str, Any], interval_key: str, point_key: str) -> str:
    """A ratio with its 95% interval where the reports allow one, else the point value."""
    return interval_text(row.get(interval_key)) or _f(row.get(point_key), ".2f")


def _peak(row: dict[str, Any]) -> str:
    """ "<MiB> rss" (CPU: resident-set peak) or "<MiB> alloc" (allocator peak); "-" when
    the report has no such figure (a CPU report before 1.2 recorded allocator zeros)."""
    v = row.get("peak_memory_bytes")
    return "-" if v is None else f"{v / 2**20:.1f} {row.get('peak_memory_kind')}"


def _noise(row: dict[str, Any]) -> str:
    return "UNRELIABLE" if row.get("unreliable") else "-"


def peak_memory(data: dict[str, Any], arm: dict[str, Any]) -> tuple[int | None, str | None]:
    """(bytes, kind) of an arm's peak memory: ``rss`` on CPU, ``alloc`` on accelerators.

    CPU reports before schema 1.2 carry allocator counters that were always 0 there and
    no RSS: (None, None), never a 0 that reads as a measurement.
    """
    mem = arm.get("memory") or {}
    if ((data.get("environment") or {}).get("device") or {}).get("type") == "cpu":
        v = mem.get("rss_peak_bytes")
        return (int(v), "rss") if v is not None else (None, None)
    v = mem.get("peak_allocated")
    return (int(v), "alloc") if v is not None else (None, None)


def _f(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def compare(
    reports: list[Report | dict[str, Any] | str | Path], *, force: bool = False
) -> Comparison:
    """Ratios between reports; CompareMismatchError on mixed regimes/machines unless force."""
    if len(reports) < 2:
        raise BadInputError("compare needs at least two reports")
    datas = [_data(r) for r in reports]
    regimes = sorted({d["regime"] for d in datas})
    machines = [machine_of(d) for d in datas]
    mismatches = []
    if len(regimes) > 1:
        mismatches.append(f"reports mix regimes ({', '.join(regimes)})")
    if len(set(machines)) > 1:
        mismatches.append(
            f"reports come from different machines ({'; '.join(sorted(set(machines)))})"
        )
    if mismatches and not force:
        raise CompareMismatchError(
            f"refusing to compare: {' and '.join(mismatches)}; pass --force to compare anyway"
        )
    labels = [_label(d, i) for i, d in enumerate(datas)]
    first = {a["name"]: a for a in datas[0]["arms"]}
    comp = Comparison(
        regime=regimes[0] if len(regimes) == 1 else "mixed",
        labels=labels,
        machines=machines,
        forced=bool(mismatches),
        mismatches=mismatches,
    )
    for label, d in zip(labels, datas, strict=True):
        line = noise_summary(d.get("noise"))
        if line:
            comp.warnings.append(f"report {label} is marked noisy ({line})")
        for arm in d["arms"]:
            peak, kind = peak_memory(d, arm)
            best = arm["tokens_per_s"].get("best") if arm["ok"] else None
            base = first.get(arm["name"])
            base_best = base["tokens_per_s"].get("best") if base and base["ok"] else None
            # Across reports nothing pairs the rounds: each side resampled on its own.
            vs_first = (
                unpaired_ratio(_samples(arm), _samples(base))
                if arm["ok"] and base and base["ok"]
                else None
            )
            comp.rows.append(
                {
                    "report": label,
                    "arm": arm["name"],
                    "ok": arm["ok"],
                    "best_tok_s": best,
                    "ratio_to_first": (best / base_best) if best and base_best else None,
                    "ratio_vs_first": vs_first.to_dict() if vs_first is not None else None,
                    "ratio_to_eager": arm.get("ratio_to_eager"),
                    "ratio_vs_eager": arm.get("ratio_vs_eager"),
                    "peak_memory_bytes": peak,
                    "peak_memory_kind": kind,
                    "unreliable": arm.get("unreliable"),
                }
            )
    return comp


def plot(
    reports: list[Report | dict[str, Any] | str | Path] | Report | dict[str, Any], path: str | Path
) -> Path:
    """Bar chart of best tok/s per arm (grouped by report), regime in the title; PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise EnvironmentMissingError(
            "plotting needs matplotlib: pip install 'pypto-bench[plot]'"
        ) from err
    items = reports if isinstance(reports, list) else [reports]
    datas = [_data(r) for r in items]
    out = Path(path)
    if not out.parent.is_dir():
        raise BadInputError(
            f"plot folder {out.parent} does not exist: create it or pick another path"
        )
    arms = []
    for d in datas:
        for a in d["arms"]:
            if a["name"] not in arms:
                arms.append(a["name"])
    regimes = sorted({d["regime"] for d in datas})
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(arms) * len(datas)), 4))
    width = 0.8 / len(datas)
    for i, d in enumerate(datas):
        by_name = {a["name"]: a for a in d["arms"]}
        values = []
        for name in arms:
            a = by_name.get(name)
            values.append((a["tokens_per_s"].get("best") or 0.0) if a and a["ok"] else 0.0)
        xs = [j + (i - (len(datas) - 1) / 2) * width for j in range(len(arms))]
        bars = ax.bar(xs, values, width, label=_label(d, i))
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(range(len(arms)), arms)
    ax.set_ylabel("tokens/s (best of N)")
    ax.set_title(f"pypto-bench: {' / '.join(regimes)} tok/s per arm")
    if len(datas) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    from pypto_common import atomic_write

    try:  # the one writer: temp file + rename, a link planted at ``out`` is replaced
        atomic_write(out, lambda fh: fig.savefig(fh, format="png", dpi=100))
    finally:
        plt.close(fig)
    return out
