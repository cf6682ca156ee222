#!/usr/bin/env python3
"""Interleaved vs sequential arms under a load that starts mid-run (issue 31), on CPU.

For the tiny model (and, with ``--large``, the 0.5B-class qwen2 shape of
tools/bench_e2e_cpu.py, seeded random weights), fp32 decode, batch 1: ``pypto-bench run
--arms eager,graph`` with ``--schedule interleaved`` and ``--schedule sequential``, each
(a) on the machine as it is ("quiet") and (b) with a CPU busy-loop process (a real
subprocess spinning) started halfway through the run's timed iterations (read from the
quiet run of the same case) and ended when the bench exits. The table gives the graph / eager
ratio with its interval per case and whether the busy case's ratio lies within the quiet
case's interval: the claim is that the interleaved one does and the sequential one does
not. Run it on a quiet machine; ``--quick`` is a seconds-long smoke (tiny model, few
tokens and rounds) whose numbers mean nothing.

    python tools/bench_schedule_cpu.py [--quick] [--large] [--json] [--workdir DIR]
        [--busy-procs N] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Interleaved vs sequential arms under a mid-run load (CPU, issue 31)"
sys.path.insert(0, str(ROOT / "tools"))

__all__ = ["BusyLoop", "Case", "busy_after", "main", "markdown", "rows", "within"]

#: The busy loop: one process spinning on a core until it is ended.
SPIN = "while True:\n    pass\n"
SCHEDULES = ("interleaved", "sequential")


class BusyLoop:
    """``procs`` real subprocesses spinning, started ``after_s`` seconds after
    :meth:`start` (on a timer thread), ended by :meth:`stop` (idempotent)."""

    def __init__(self, after_s: float, procs: int = 1) -> None:
        self.after_s = after_s
        self.procs = procs
        self.started_at: float | None = None
        self.pids: list[int] = []
        self._children: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()
        self._stopped = False
        self._timer = threading.Timer(after_s, self._spawn)
        self._timer.daemon = True

    def _spawn(self) -> None:
        with self._lock:
            if self._stopped:
                return
            for _ in range(self.procs):
                child = subprocess.Popen([sys.executable, "-c", SPIN])
                self._children.append(child)
                self.pids.append(child.pid)
            self.started_at = time.monotonic()

    def start(self) -> BusyLoop:
        self._timer.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._timer.cancel()
            for child in self._children:
                if child.poll() is None:
                    child.terminate()
            for child in self._children:
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()

    def __enter__(self) -> BusyLoop:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Case:
    """One bench run: a model, a schedule, quiet or busy, and what it measured."""

    model: str
    schedule: str
    load: str  # "quiet" | "busy"
    ratio: dict[str, Any] | None = None  # graph arm's ratio_vs_eager interval
    wall_s: float = 0.0
    timed_s: float = 0.0  # the timed iterations' seconds, all arms
    busy_after_s: float | None = None
    busy_started: bool = False
    noise: str | None = None
    exit_code: int = 0
    argv: list[str] = field(default_factory=list)


def within(value: dict[str, Any] | None, ref: dict[str, Any] | None) -> bool | None:
    """Does ``value``'s median lie inside ``ref``'s interval (None if either is missing)?"""
    if not value or not ref:
        return None
    return bool(ref["low"] <= value["median"] <= ref["high"])


def _bench(model: Path, report: Path, schedule: str, *, gen: int, iters: int) -> tuple[int, dict]:
    from pypto_bench.cli import main as bench_main

    argv = [
        "run", "--model-path", str(model), "--device", "cpu", "--dtype", "float32",
        "--regime", "decode", "--seq", "16", "--gen", str(gen), "--warmup", "1",
        "--iters", str(iters), "--ignore-eos", "--no-progress", "--arms", "eager,graph",
        "--schedule", schedule, "--report-file", str(report),
    ]  # fmt: skip
    print("+ pypto-bench " + shlex.join(argv), file=sys.stderr, flush=True)
    code = bench_main(argv)
    data = json.loads(report.read_text()) if report.exists() else {}
    data["_argv"] = ["pypto-bench", *argv]
    return code, data


def _case(
    name: str,
    model: Path,
    work: Path,
    schedule: str,
    load: str,
    *,
    gen: int,
    iters: int,
    busy_after_s: float | None = None,
    busy_procs: int = 1,
) -> Case:
    from pypto_bench.noise import summary as noise_summary

    report = work / f"{name}-{schedule}-{load}.json"
    busy = BusyLoop(busy_after_s, busy_procs) if busy_after_s is not None else None
    t0 = time.monotonic()
    if busy is not None:
        busy.start()
    try:
        code, data = _bench(model, report, schedule, gen=gen, iters=iters)
    finally:
        if busy is not None:
            busy.stop()
    wall = time.monotonic() - t0
    graph: dict[str, Any] = next((a for a in data.get("arms", []) if a.get("name") == "graph"), {})
    return Case(
        model=name,
        schedule=schedule,
        load=load,
        ratio=graph.get("ratio_vs_eager"),
        wall_s=wall,
        timed_s=sum(sum(a.get("seconds", {}).get("samples") or []) for a in data.get("arms", [])),
        busy_after_s=busy_after_s,
        busy_started=bool(busy and busy.started_at is not None),
        noise=noise_summary(data.get("noise")) or None,
        exit_code=code,
        argv=data.get("_argv", []),
    )


def busy_after(quiet: Case) -> float:
    """When the busy loop starts: halfway through the quiet run's timed iterations, which
    end the run (every arm is built before them, or before each arm's own block)."""
    return max(quiet.wall_s - quiet.timed_s / 2, 0.0)


def _fmt(r: dict[str, Any] | None) -> str:
    return "-" if not r else f"{r['median']:.2f} [{r['low']:.2f}, {r['high']:.2f}]"


def rows(cases: list[Case]) -> list[dict[str, Any]]:
    """One row per (model, schedule): quiet and busy ratios and the within verdict."""
    out = []
    for model in dict.fromkeys(c.model for c in cases):
        for schedule in SCHEDULES:
            got = {c.load: c for c in cases if c.model == model and c.schedule == schedule}
            quiet, busy = got.get("quiet"), got.get("busy")
            if quiet is None or busy is None:
                continue
            out.append(
                {
                    "model": model,
                    "schedule": schedule,
                    "quiet": quiet.ratio,
                    "busy": busy.ratio,
                    "busy_within_quiet": within(busy.ratio, quiet.ratio),
                    "busy_after_s": busy.busy_after_s,
                    "busy_started": busy.busy_started,
                    "wall_s": {"quiet": quiet.wall_s, "busy": busy.wall_s},
                }
            )
    return out


def markdown(table: list[dict[str, Any]], cases: list[Case], *, quick: bool, procs: int) -> str:
    yes = {True: "yes", False: "NO", None: "-"}
    lines = [
        SECTION,
        "",
        "Decode, fp32, batch 1, seq 16, `--ignore-eos`, `pypto-bench run --arms eager,graph`;",
        "graph / eager tok/s as the report's `ratio_vs_eager` (median [95% interval]). The busy",
        f"case starts {procs} CPU busy-loop process(es) halfway through the timed iterations",
        "(as the quiet run of the same case timed them, after one discarded warm-up run",
        "compiled the model) and ends them when the bench exits.",
        f"Load average when rendered: {os.getloadavg()[0]:.1f}."
        + (" `--quick` smoke: the numbers mean nothing." if quick else ""),
        "",
        "| model | schedule | quiet x eager | busy x eager | busy starts at s | busy within quiet interval |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in table:
        started = f"{r['busy_after_s']:.0f}" if r["busy_started"] else "never (run too short)"
        lines.append(
            f"| {r['model']} | {r['schedule']} | {_fmt(r['quiet'])} | {_fmt(r['busy'])} | "
            f"{started} | {yes[r['busy_within_quiet']]} |"
        )
    flagged = [c for c in cases if c.noise]
    if flagged:
        lines += ["", "Noise guard:"]
        lines += [f"- {c.model} {c.schedule} {c.load}: {c.noise}" for c in flagged]
    lines += ["", "Reproduce: `python tools/bench_schedule_cpu.py --large --write`; the runs:", ""]
    lines += [f"    {shlex.join(c.argv)}" for c in cases if c.argv]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="seconds-long smoke: tiny, few rounds")
    ap.add_argument("--large", action="store_true", help="also the 0.5B-class qwen2 shape")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--busy-procs", type=int, default=1, help="busy-loop processes (default 1)")
    ap.add_argument("--write", action="store_true", help=f"write the section to {DOC.name}")
    args = ap.parse_args(argv)
    if args.busy_procs < 1:
        print("bench_schedule_cpu: --busy-procs must be >= 1", file=sys.stderr)
        return 2
    if args.quick and (args.large or args.write):
        print("bench_schedule_cpu: --quick is a smoke: drop --large / --write", file=sys.stderr)
        return 2
    from bench_e2e_cpu import QWEN05_SHAPE

    from pypto_testing.models import make_tiny_model

    work = Path(args.workdir or tempfile.mkdtemp(prefix="pypto-schedule-"))
    models: list[tuple[str, Path, int, int]] = []
    tiny = work / "tiny"
    if not (tiny / "config.json").exists():
        make_tiny_model(tiny, "llama")
    models.append(("tiny llama", tiny, 4 if args.quick else 32, 3 if args.quick else 30))
    if args.large:
        big = work / "qwen05b"
        if not (big / "config.json").exists():
            make_tiny_model(big, "qwen2", **QWEN05_SHAPE)
        models.append(("0.5B-class qwen2", big, 32, 12))
    cases: list[Case] = []
    for name, path, gen, iters in models:
        # Discarded: compiles once, so every measured run builds with the same warm caches.
        _case(name, path, work, "interleaved", "warm-up", gen=gen, iters=1)
        for schedule in SCHEDULES:
            quiet = _case(name, path, work, schedule, "quiet", gen=gen, iters=iters)
            cases.append(quiet)
            cases.append(
                _case(
                    name,
                    path,
                    work,
                    schedule,
                    "busy",
                    gen=gen,
                    iters=iters,
                    busy_after_s=busy_after(quiet),
                    busy_procs=args.busy_procs,
                )
            )
    table = rows(cases)
    md = markdown(table, cases, quick=args.quick, procs=args.busy_procs)
    if args.json:
        print(json.dumps({"rows": table, "quick": args.quick, "workdir": str(work)}))
    else:
        print(md)
    if args.write:
        from bench_e2e_cpu import write_section

        write_section(md, SECTION, DOC)
        print(f"wrote {DOC}", file=sys.stderr)
    return 1 if any(c.exit_code for c in cases) else 0


if __name__ == "__main__":
    raise SystemExit(main())
