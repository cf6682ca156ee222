"""``pypto-e2e run --history DB``: the bench step records its report in pypto-bench's
results history (a real SQLite file), once per measurement; a CI job gates on
``pypto-bench history check``; a file that is not a history is refused before any step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_e2e import EXIT, MANIFEST_NAME
from pypto_e2e.demo import demo_model_dir

BIN = Path(sys.executable).parent
RUN = ["run", "--skip", "download", "--device", "cpu", "--arms", "eager", "--regime",
       "prefill", "--seq", "8", "--iters", "2", "--warmup", "1", "--no-bandwidth"]  # fmt: skip


def _e2e(tmp: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [
            str(BIN / "pypto-e2e"),
            *RUN,
            "--model-path",
            str(tmp / "model"),
            "--work-dir",
            str(tmp / "work"),
            *flags,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def model(tmp_path: Path) -> Path:
    shutil.copytree(demo_model_dir(), tmp_path / "model")
    return tmp_path


def test_each_measurement_is_recorded_once(model: Path) -> None:
    db = model / "history.sqlite"
    first = _e2e(model, "--history", str(db))
    assert first.returncode == EXIT.OK, first.stderr[-3000:]
    assert "recorded as run 1 in history" in first.stderr
    again = _e2e(model, "--history", str(db))  # every step reused: nothing new measured
    assert again.returncode == EXIT.OK, again.stderr[-3000:]
    assert "recorded as run" not in again.stderr
    third = _e2e(model, "--history", str(db), "--from", "bench")  # measured again
    assert third.returncode == EXIT.OK, third.stderr[-3000:]
    assert "recorded as run 2 in history" in third.stderr
    listed = subprocess.run(
        [str(BIN / "pypto-bench"), "history", "list", "--db", str(db), "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    runs = json.loads(listed.stdout)
    assert len(runs) == 2
    manifest = json.loads((model / "work" / MANIFEST_NAME).read_text())
    assert "history" in json.dumps(manifest)
    # The gate a CI job runs on the newest run against the earlier one(s).
    gate = subprocess.run(
        [str(BIN / "pypto-bench"), "history", "check", "--db", str(db), "--min-runs", "1",
         "--json"],
        capture_output=True, text=True,
    )  # fmt: skip
    verdict = json.loads(gate.stdout)
    (group,) = verdict["groups"]  # the two e2e measurements are one (model, regime, arm)
    assert (group["regime"], group["arm"], group["run_id"], group["earlier_runs"]) == (
        "prefill", "eager", 2, 1,
    )  # fmt: skip
    # two measurements of a noisy CPU: whichever way they moved, the gate judged them
    assert group["verdict"] in ("ok", "regression", "improvement")
    assert gate.returncode == (49 if verdict["regressed"] else 0)


def test_a_file_that_is_not_a_history_is_refused_before_any_step(model: Path) -> None:
    db = model / "notes.txt"
    db.write_text("not a database\n")
    got = _e2e(model, "--history", str(db))
    assert got.returncode == EXIT.USAGE, got.stderr[-2000:]
    errors = [ln for ln in got.stderr.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1, got.stderr
    assert "is not an SQLite database" in errors[0]
    assert not (model / "work").exists()
    assert db.read_text() == "not a database\n"


def test_an_unwritable_history_is_refused_before_any_step(
    model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #43's second pass: the bench step ran and then could not record (a read-only
    folder): the same writability check as `pypto-bench run --history`, before any step.
    (As root the file modes do not bind: the check is os.access, answered False here.)"""
    from pypto_bench import history
    from pypto_e2e.cli import main

    folder = model / "ro"
    folder.mkdir()
    real = os.access
    monkeypatch.setattr(
        history.os, "access", lambda p, mode: False if Path(p) == folder else real(p, mode)
    )
    argv = [*RUN, "--model-path", str(model / "model"), "--work-dir", str(model / "work"),
            "--history", str(folder / "h.db")]  # fmt: skip
    assert main(argv) == EXIT.USAGE
    errors = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1
    assert "is not writable" in errors[0]
    assert not (model / "work").exists()
