"""A rank that dies or hangs mid-run ends the whole --nproc run, named, with no process left.

Real failures, no injection hooks: rank 1 is sent SIGKILL (it dies) or SIGSTOP (it hangs,
alive) while it iterates; the run must end with one line naming rank 1 and the cause,
and every process of the launch (agent and ranks) must be gone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from pypto_bench.errors import EXIT, RankFailedError
from pypto_bench.multi import run_distributed, visible_devices

sys.path.insert(0, str(Path(__file__).parent))
from _dist_fixtures import alive, group_members, prefill_config

pytestmark = pytest.mark.skipif(visible_devices("cpu") < 2, reason="needs 2 CPU cores")


def _run_and_hit(folder: Path, state: Path, sig: int, rank_timeout: float) -> tuple[str, float]:
    # iters: far longer than the test waits, the run only ends by the failure
    config = prefill_config(folder, iters=3000, rank_timeout=rank_timeout)
    outcome: dict[str, BaseException] = {}

    def target() -> None:
        try:
            run_distributed(config, state_dir=state)
        except BaseException as err:  # handed to the test thread
            outcome["err"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    beat = state / "rank1.json"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            st = json.loads(beat.read_text())
        except (OSError, ValueError):
            st = {}
        if str(st.get("stage", "")).startswith("iteration"):
            break
        time.sleep(0.1)
    else:
        pytest.fail("rank 1 never reached its iterations")
    hit = time.monotonic()
    os.kill(st["pid"], sig)
    thread.join(timeout=rank_timeout + 120)
    assert not thread.is_alive(), "the run did not end after the rank failed"
    err = outcome.get("err")
    assert isinstance(err, RankFailedError), repr(err)
    assert err.exit_code == EXIT.RANK_FAILED
    return str(err), time.monotonic() - hit


def _assert_all_gone(state: Path) -> None:
    pids = [json.loads((state / f"rank{r}.json").read_text())["pid"] for r in (0, 1)]
    assert not any(alive(p) for p in pids)
    assert group_members(int((state / "launcher.pid").read_text())) == []


def test_killed_rank_ends_the_run_and_every_process(tiny_llama, tmp_path):
    msg, took = _run_and_hit(tiny_llama, tmp_path / "state", signal.SIGKILL, 120)
    assert msg.startswith("rank 1 failed: killed by SIGKILL"), msg
    assert "\n" not in msg
    assert took < 60
    _assert_all_gone(tmp_path / "state")


def test_hung_rank_is_named_within_the_timeout(tiny_llama, tmp_path):
    msg, took = _run_and_hit(tiny_llama, tmp_path / "state", signal.SIGSTOP, 15)
    assert msg.startswith("rank 1 hung (its process is stopped)"), msg
    assert "--rank-timeout" in msg
    assert "\n" not in msg
    assert 15 <= took < 15 + 30
    _assert_all_gone(tmp_path / "state")
