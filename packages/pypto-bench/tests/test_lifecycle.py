"""Nothing of a --nproc run outlives the command, whatever ends it (issue 27, items 1 and
17): real `pypto-bench run --nproc 2` commands killed with SIGKILL / SIGTERM while their
ranks load, run the 1-rank baseline or iterate; then no descendant is alive and nothing
of the run is left in the temporary directory. (The two mechanisms on their own, the
parent-death signal and the polling watch, are proven in pypto-common's test_parent.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pypto_bench.multi import DEVICE_ID_ENV, visible_devices
from pypto_bench.multi.lifecycle import TERMINATED_EXIT

sys.path.insert(0, str(Path(__file__).parent))
from _dist_fixtures import alive, descendants, group_members

# What torch keeps in the temporary directory across runs by design (inductor's compile
# cache, shared by every torch process of the user): not the run's, left alone.
TORCH_CACHE_PREFIX = "torchinductor_"
SETTLE_S = 10.0  # "no descendant alive 10 s later"


def _loading(beats: dict[int, dict[str, Any]]) -> bool:
    """Both ranks up, none iterating yet: rendezvous, rank 0 loading the whole model."""
    return sorted(beats) == [0, 1] and not any("iteration" in b["stage"] for b in beats.values())


def _baseline(beats: dict[int, dict[str, Any]]) -> bool:
    """Rank 0 timing the whole model alone (rank 1 waits for it)."""
    return str(beats.get(0, {}).get("stage", "")).startswith("1-rank baseline: iteration")


def _timed_loop(beats: dict[int, dict[str, Any]]) -> bool:
    """Both ranks in the sharded timed iterations."""
    return sorted(beats) == [0, 1] and all(
        b["stage"].startswith("iteration") for b in beats.values()
    )


# The moments, read from the heartbeat files the ranks write (rank, step, stage).
MOMENTS = {"loading": _loading, "baseline": _baseline, "timed loop": _timed_loop}


def _heartbeats(tmp: Path) -> dict[int, dict[str, Any]]:
    beats = {}
    for path in tmp.glob("pypto-dist-*/rank[0-9].json"):
        try:
            st = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        beats[int(st["rank"])] = st
    return beats


def _left_behind(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith(TORCH_CACHE_PREFIX))


@pytest.fixture(scope="session")
def killed_run(tiny_llama, tmp_path_factory):
    """One real command per (signal, moment), killed there; what was seen, cached."""
    done: dict[tuple[int, str], dict[str, Any]] = {}

    def run(sig: int, moment: str) -> dict[str, Any]:
        if (sig, moment) in done:
            return done[(sig, moment)]
        base = tmp_path_factory.mktemp(f"killed-{sig}-{moment.replace(' ', '-')}")
        tmp = base / "tmp"
        tmp.mkdir()
        env = {**os.environ, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", "pypto_bench", "run", "--model-path", str(tiny_llama),
                "--device", "cpu", "--regime", "prefill", "--seq", "8", "--arms", "eager",
                "--warmup", "0", "--iters", "100000", "--dtype", "float32", "--no-bandwidth",
                "--nproc", "2", "--rank-timeout", "300"]  # fmt: skip
        if moment == "timed loop":
            argv.append("--no-baseline")
        err_path = base / "stderr.txt"
        with open(err_path, "wb") as err:
            cli = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
        try:
            deadline = time.monotonic() + 300
            while True:
                beats = _heartbeats(tmp)
                if MOMENTS[moment](beats):
                    break
                assert cli.poll() is None, err_path.read_text()[-2000:]
                assert time.monotonic() < deadline, f"never reached {moment}: {beats}"
                time.sleep(0.05)
            launcher = int(next(tmp.glob("pypto-dist-*/launcher.pid")).read_text())
            family = descendants(cli.pid)
            assert launcher in family, family
            assert len(family) >= 3, family  # launcher + 2 ranks
            os.kill(cli.pid, sig)
            killed = time.monotonic()
            code = cli.wait(timeout=120)
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()
        left: list[str] = []
        alive_now: list[int] = []
        while time.monotonic() - killed < SETTLE_S:
            alive_now = sorted(p for p in family if alive(p)) + group_members(launcher)
            left = _left_behind(tmp)
            if not alive_now and not left:
                break
            time.sleep(0.1)
        done[(sig, moment)] = {
            "code": code,
            "stderr": err_path.read_text(errors="replace"),
            "beats": beats,
            "family": family,
            "alive": alive_now,
            "left": left,
            "settled_s": time.monotonic() - killed,
        }
        return done[(sig, moment)]

    return run


@pytest.mark.skipif(visible_devices("cpu") < 2, reason="needs 2 CPU cores")
@pytest.mark.parametrize(
    ("sig", "moment"),
    [
        (signal.SIGKILL, "loading"),
        (signal.SIGTERM, "loading"),
        (signal.SIGTERM, "baseline"),
        (signal.SIGKILL, "timed loop"),
    ],
    ids=["kill-9-loading", "kill-15-loading", "kill-15-baseline", "kill-9-timed-loop"],
)
def test_a_killed_run_leaves_no_process_and_no_temporary_folder(killed_run, sig, moment):
    seen = killed_run(sig, moment)
    assert seen["alive"] == [], f"still running {SETTLE_S:g} s after the kill: {seen}"
    assert seen["left"] == [], f"left in the temporary directory: {seen['left']}"
    if sig == signal.SIGTERM:  # handled like Ctrl-C: one line, the shell's code for SIGTERM
        assert seen["code"] == TERMINATED_EXIT == 143, seen["stderr"][-2000:]
        lines = [ln for ln in seen["stderr"].splitlines() if ln.strip()]
        assert lines[-1] == "pypto-bench: error: terminated by SIGTERM", lines[-5:]
    else:
        assert seen["code"] == -signal.SIGKILL


@pytest.mark.skipif(visible_devices("cpu") < 2, reason="needs 2 CPU cores")
def test_each_rank_has_its_local_device_index_in_tile_fwk_device_id(killed_run):
    """Issue 27 item 17: the variable is in each rank's environment (its heartbeat records
    what the rank's os.environ holds once it is running), set before PyPTO is imported."""
    seen = killed_run(signal.SIGKILL, "timed loop")
    beats = seen["beats"]
    assert sorted(beats) == [0, 1]
    for rank, st in beats.items():
        assert st[DEVICE_ID_ENV] == str(rank), st
    assert "PyPTO was imported before" not in seen["stderr"]
