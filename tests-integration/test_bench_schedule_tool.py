"""tools/bench_schedule_cpu.py's cheap parts (the benchmark itself is run by hand on a
quiet machine): the busy loop is a real process started late and ended, the verdict
column reads the quiet interval, and bad usage exits 2 before anything runs."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import bench_schedule_cpu as tool  # noqa: E402


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_busy_loop_starts_after_the_delay_and_is_ended():
    busy = tool.BusyLoop(after_s=0.2, procs=1).start()
    try:
        assert busy.pids == []  # not yet: it starts after the delay
        deadline = time.monotonic() + 30
        while not busy.pids and time.monotonic() < deadline:
            time.sleep(0.05)
        (pid,) = busy.pids
        assert _alive(pid)
    finally:
        busy.stop()
    assert not _alive(pid)  # terminated and reaped


def test_busy_loop_stopped_before_its_delay_never_starts():
    busy = tool.BusyLoop(after_s=5.0).start()
    busy.stop()
    time.sleep(0.1)
    assert busy.pids == []
    assert busy.started_at is None


def _iv(median: float, low: float, high: float) -> dict:
    return {"median": median, "low": low, "high": high, "rounds": 9, "method": "m", "level": 0.95}


def test_rows_judge_the_busy_ratio_against_the_quiet_interval():
    cases = [
        tool.Case("tiny", "interleaved", "quiet", _iv(2.0, 1.9, 2.1), wall_s=10, timed_s=4),
        tool.Case("tiny", "interleaved", "busy", _iv(2.05, 1.8, 2.3), busy_after_s=8.0),
        tool.Case("tiny", "sequential", "quiet", _iv(2.0, 1.9, 2.1)),
        tool.Case("tiny", "sequential", "busy", _iv(1.2, 1.1, 1.3), busy_after_s=8.0),
    ]
    table = tool.rows(cases)
    assert [(r["schedule"], r["busy_within_quiet"]) for r in table] == [
        ("interleaved", True),
        ("sequential", False),
    ]
    assert tool.busy_after(cases[0]) == 8.0  # halfway through the 4 s of timed rounds
    md = tool.markdown(table, cases, quick=True, procs=1)
    assert "| tiny | sequential | 2.00 [1.90, 2.10] | 1.20 [1.10, 1.30] |" in md
    assert tool.within(None, _iv(1, 0, 2)) is None


@pytest.mark.parametrize("argv", [["--quick", "--large"], ["--busy-procs", "0"]])
def test_bad_usage_exits_2_before_running(argv, capsys):
    assert tool.main(argv) == 2
    assert "bench_schedule_cpu:" in capsys.readouterr().err
