"""Where the test suite's time and memory go: tables from one profiled run.

Why: the README's test command has a budget (docs/testing.md); keeping it needs to know
which tests and fixtures cost what. A run with ``PYPTO_TEST_PROFILE=<folder>`` (the root
conftest.py writes one JSON line per test and per fixture setup over 0.5 s, per process)
and, optionally, ``tools/measure_tests.py --csv <folder>/rss.csv`` (the process tree's
memory over time) is turned into markdown tables on stdout:

    PYPTO_TEST_PROFILE=/tmp/prof python tools/measure_tests.py --csv /tmp/prof/rss.csv \\
        -- nox -s tests
    python tools/suite_profile.py /tmp/prof --top 40 > /tmp/prof/tables.md

The folder is this machine's own output, but it is still parsed defensively: a line that
is not a JSON object with the expected fields is counted and skipped, never trusted.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

__all__ = ["load", "main", "render"]

_MAX_LINE = 1 << 20
_PHASES = ("setup", "call", "teardown")


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def load(folder: Path) -> tuple[list[dict], list[dict], int]:
    """(test lines, fixture lines, lines skipped) from every ``profile-*.jsonl`` there."""
    tests: list[dict] = []
    fixtures: list[dict] = []
    skipped = 0
    for path in sorted(folder.glob("profile-*.jsonl")):
        if not path.is_file() or path.is_symlink():
            continue
        with path.open(encoding="utf-8", errors="replace") as fh:
            for raw in fh:
                if len(raw) > _MAX_LINE:
                    skipped += 1
                    continue
                try:
                    line = json.loads(raw)
                except ValueError:
                    skipped += 1
                    continue
                if not isinstance(line, dict):
                    skipped += 1
                elif isinstance(line.get("nodeid"), str) and "fixture" not in line:
                    if all(_num(line.get(p)) is not None for p in _PHASES):
                        tests.append(line)
                    else:
                        skipped += 1
                elif isinstance(line.get("fixture"), str) and _num(line.get("seconds")):
                    fixtures.append(line)
                else:
                    skipped += 1
    return tests, fixtures, skipped


def _total(line: dict) -> float:
    return sum(float(line[p]) for p in _PHASES)


def _package(nodeid: str) -> str:
    parts = nodeid.split("/")
    if parts[0] == "packages" and len(parts) > 1:
        return parts[1]
    return parts[0]


def _mib(value: object) -> str:
    num = _num(value)
    return f"{num:,.0f}" if num is not None else "-"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rss(folder: Path) -> dict[str, float] | None:
    path = folder / "rss.csv"
    if not path.is_file():
        return None
    peak_rss = peak_pss = last = 0.0
    at = 0.0
    with path.open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            secs, rss, pss = (_num(_float(row.get(k))) for k in ("seconds", "rss_mib", "pss_mib"))
            if secs is None or rss is None:
                continue
            last = secs
            if rss > peak_rss:
                peak_rss, at = rss, secs
            peak_pss = max(peak_pss, pss or 0.0)
    return {"peak_rss": peak_rss, "peak_at": at, "peak_pss": peak_pss, "wall": last}


def _float(text: object) -> float | None:
    try:
        return float(str(text))
    except ValueError:
        return None


def render(folder: Path, top: int = 40) -> str:
    """The markdown tables for one profiled run."""
    tests, fixtures, skipped = load(folder)
    out: list[str] = []
    if not tests:
        return "no test lines found (was PYPTO_TEST_PROFILE set for the run?)\n"
    starts = [float(t["start"]) for t in tests if _num(t.get("start")) is not None]
    span = max(float(t["start"]) + _total(t) for t in tests) - min(starts) if starts else 0.0
    workers: dict[str, float] = defaultdict(float)
    for t in tests:
        workers[str(t.get("worker"))] += _total(t)
    outcomes: dict[str, int] = defaultdict(int)
    for t in tests:
        outcomes[str(t.get("outcome"))] += 1
    out.append(
        f"{len(tests)} tests ({', '.join(f'{v} {k}' for k, v in sorted(outcomes.items()))}); "
        f"first start to last end {span / 60:.1f} min; test time summed "
        f"{sum(workers.values()) / 60:.1f} min over {len(workers)} process(es) "
        f"({', '.join(f'{w} {s / 60:.1f} min' for w, s in sorted(workers.items()))})"
        + (f"; {skipped} unreadable lines skipped" if skipped else "")
    )
    rss = _rss(folder)
    if rss:
        out.append(
            f"\nWhole process tree (tools/measure_tests.py, sampled each second): peak RSS "
            f"{rss['peak_rss'] / 1024:.2f} GiB at {rss['peak_at'] / 60:.1f} min, peak PSS "
            f"{rss['peak_pss'] / 1024:.2f} GiB, {rss['wall'] / 60:.1f} min sampled."
        )
    out.append("\n| package | tests | seconds | share |\n|---|---:|---:|---:|")
    per_pkg: dict[str, list[float]] = defaultdict(list)
    for t in tests:
        per_pkg[_package(t["nodeid"])].append(_total(t))
    whole = sum(workers.values()) or 1.0
    for pkg, times in sorted(per_pkg.items(), key=lambda kv: -sum(kv[1])):
        out.append(f"| {pkg} | {len(times)} | {sum(times):.0f} | {100 * sum(times) / whole:.1f}% |")
    out.append(
        f"\nTop {top} tests by time (setup + call + teardown; a session fixture's setup is "
        "paid by the first test that asks for it) and this process's peak resident memory "
        "during the test:\n\n| # | test | setup s | call s | total s | peak MiB | child MiB |"
        "\n|---:|---|---:|---:|---:|---:|---:|"
    )
    for i, t in enumerate(sorted(tests, key=_total, reverse=True)[:top], 1):
        out.append(
            f"| {i} | `{_cell(t['nodeid'])}` | {float(t['setup']):.1f} | {float(t['call']):.1f} "
            f"| {_total(t):.1f} | {_mib(t.get('peak_mib'))} | {_mib(t.get('child_peak_mib'))} |"
        )
    if fixtures:
        out.append(
            f"\nTop {top} fixture setups (each setup counted; the fixture's own time, not its "
            "dependencies'):\n\n| # | fixture | scope | defined in | times set up | seconds "
            "(sum) | peak MiB |\n|---:|---|---|---|---:|---:|---:|"
        )
        grouped: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
        for f in fixtures:
            grouped[(f["fixture"], str(f.get("scope")), str(f.get("baseid")))].append(f)
        ranked = sorted(grouped.items(), key=lambda kv: -sum(float(f["seconds"]) for f in kv[1]))
        for i, ((name, scope, base), rows) in enumerate(ranked[:top], 1):
            peak = max((_num(r.get("peak_mib")) or 0.0) for r in rows)
            out.append(
                f"| {i} | `{_cell(name)}` | {_cell(scope)} | `{_cell(base) or '(root)'}` | "
                f"{len(rows)} | {sum(float(r['seconds']) for r in rows):.1f} | {peak:,.0f} |"
            )
    heavy = sorted(tests, key=lambda t: -(_num(t.get("peak_mib")) or 0.0))[:15]
    out.append(
        "\nTop 15 tests by this process's peak resident memory:\n\n| test | peak MiB | "
        "after MiB | total s |\n|---|---:|---:|---:|"
    )
    for t in heavy:
        out.append(
            f"| `{_cell(t['nodeid'])}` | {_mib(t.get('peak_mib'))} | "
            f"{_mib(t.get('rss_after_mib'))} | {_total(t):.1f} |"
        )
    slow = [t for t in tests if isinstance(t.get("slow"), str)]
    if slow:
        out.append(
            "\nTests marked `slow(reason=...)` (allowed past the per-phase budget):\n\n| test "
            "| total s | reason |\n|---|---:|---|"
        )
        for t in sorted(slow, key=_total, reverse=True):
            out.append(f"| `{_cell(t['nodeid'])}` | {_total(t):.1f} | {_cell(t['slow'])} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the PYPTO_TEST_PROFILE folder of a run")
    parser.add_argument("--top", type=int, default=40, help="rows per table (1-500)")
    args = parser.parse_args(argv)
    if not 1 <= args.top <= 500:
        parser.error("--top: between 1 and 500")
    if not args.folder.is_dir():
        print(
            f"suite_profile: {args.folder} is not a folder: pass a PYPTO_TEST_PROFILE folder",
            file=sys.stderr,
        )
        return 2
    sys.stdout.write(render(args.folder, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
