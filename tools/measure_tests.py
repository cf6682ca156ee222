"""Run a command and record the resident memory of its whole process tree over time.

Why: the suite's memory budget (8 GB on the 2-core machine) is about everything the test
command keeps resident at once: pytest's process, each xdist worker, every child a test
starts. One process's ``ru_maxrss`` sees none of that. This samples the tree from /proc
(Linux) every ``--every`` seconds and writes one CSV row per sample (seconds since start,
processes, summed RSS and, every tenth sample, summed PSS in MiB; PSS shares a page mapped by several processes
among them, RSS counts it in each, so RSS over-states), then prints the wall time and the
peaks as JSON on stdout.

    python tools/measure_tests.py --csv /tmp/rss.csv -- nox -s tests

The command's exit status is this script's exit status; SIGINT / SIGTERM reach the
command's process group; a second signal kills it. The summary names the program, never
its arguments (a command line may carry a token).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main", "tree_memory"]


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            kids.setdefault(int(fields[1]), []).append(int(entry))
    return kids


def _kib(pid: int, path: str, field: str) -> int:
    try:
        with open(f"/proc/{pid}/{path}", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return 0
    return 0


def tree_memory(root: int, *, with_pss: bool = True) -> tuple[int, float, float | None]:
    """(processes, RSS MiB, PSS MiB or None) summed over ``root`` and its descendants.

    PSS walks every page table of every process (``smaps_rollup``): a third of a core
    when sampled each second over multi-GB workers, so the caller asks for it less often.
    """
    kids = _children_map()
    todo, seen = [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(kids.get(pid, ()))
    rss = sum(_kib(pid, "status", "VmRSS") for pid in seen)
    if not with_pss:
        return len(seen), rss / 1024, None
    pss = sum(_kib(pid, "smaps_rollup", "Pss") for pid in seen)
    return len(seen), rss / 1024, pss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, required=True, help="where the samples go")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    if not (0.05 <= args.every <= 60):
        parser.error("--every: between 0.05 and 60 seconds")
    start = time.monotonic()
    proc = subprocess.Popen(command, start_new_session=True)

    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        # The first signal is passed on; a second one kills the tree (a command that
        # ignores SIGTERM cannot keep this script waiting).
        try:
            os.killpg(proc.pid, signal.SIGKILL if forwarded else signum)
        except ProcessLookupError:
            pass
        forwarded.append(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    peak_rss = peak_pss = 0.0
    peak_at = 0.0
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["seconds", "processes", "rss_mib", "pss_mib"])
        sample = 0
        while proc.poll() is None:
            # RSS every sample, PSS every tenth (see tree_memory).
            count, rss, pss = tree_memory(proc.pid, with_pss=sample % 10 == 0)
            sample += 1
            now = time.monotonic() - start
            out.writerow([f"{now:.1f}", count, f"{rss:.0f}", "" if pss is None else f"{pss:.0f}"])
            fh.flush()
            if rss > peak_rss:
                peak_rss, peak_at = rss, now
            peak_pss = max(peak_pss, pss or 0.0)
            time.sleep(args.every)
    wall = time.monotonic() - start
    summary = {
        # The program only: a command line may carry a token, and this line is printed.
        "program": Path(command[0]).name,
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "peak_rss_mib": round(peak_rss),
        "peak_rss_at_s": round(peak_at, 1),
        "peak_pss_mib": round(peak_pss),
        "csv": str(args.csv),
    }
    print(json.dumps(summary))
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


if __name__ == "__main__":
    sys.exit(main())
