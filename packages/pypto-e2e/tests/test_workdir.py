"""The work dir: one live run at a time (issue 27 item 1), and a path that cannot be
used is one line with its own exit code before any step (item 12).

The lock test uses real processes: a real `pypto-e2e run` stopped (SIGSTOP) inside its
smoke step holds the work dir; a second real CLI run is refused naming it; after the
first is SIGKILLed (no chance to clean up) the same command runs and resumes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pypto_e2e import EXIT, MANIFEST_NAME
from pypto_e2e.workdir import LOCK_NAME

ONLY_PATCH = "download,smoke,precision,bench"
SMOKE_RUN = [
    "--skip",
    "download,bench",
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--prompt",
    "And it came to pass",
]


def _cli_process(work: Path, model: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pypto_e2e",
        "run",
        "--work-dir",
        str(work),
        "--model-path",
        str(model),
        *extra,
    ]


def _statuses(work: Path) -> dict[str, str]:
    steps = json.loads((work / MANIFEST_NAME).read_text())["steps"]
    return {name: step["status"] for name, step in steps.items()}


def test_a_second_run_is_refused_while_the_first_lives_and_runs_once_it_is_killed(
    tmp_path, demo_model, tree_state
):
    pytest.importorskip("transformers")
    work = tmp_path / "work"
    first = subprocess.Popen(
        _cli_process(work, demo_model, *SMOKE_RUN),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        seen = []
        assert first.stderr is not None
        while True:  # the run is in its smoke step once it says so
            line = first.stderr.readline()
            assert line, f"the first run ended early: {''.join(seen)}"
            seen.append(line)
            if line.startswith("[smoke] running"):
                break
            assert time.monotonic() < deadline, "the first run never reached the smoke step"
        first.send_signal(signal.SIGSTOP)  # a live run, stopped at a step
        before = tree_state(work)
        assert _statuses(work)["smoke"] == "running"

        second = subprocess.run(
            _cli_process(work, demo_model, *SMOKE_RUN, "--json"),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert second.returncode == EXIT.WORK_DIR_BUSY, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert str(work) in lines[0]
        assert f"pid {first.pid})" in lines[0]
        assert "--work-dir" in lines[0]
        doc = json.loads(second.stdout)
        assert doc["error"]["name"] == "WORK_DIR_BUSY"
        assert tree_state(work) == before  # the refused run touched nothing
    finally:
        first.kill()  # SIGKILL: the run gets no chance to release anything
        first.wait(timeout=60)
        if first.stderr:
            first.stderr.close()

    assert (work / LOCK_NAME).exists()  # left by the killed run, but not held by anyone
    third = subprocess.run(
        _cli_process(work, demo_model, *SMOKE_RUN), capture_output=True, text=True, timeout=300
    )
    assert third.returncode == EXIT.OK, third.stderr
    assert "[patch] reused" in third.stderr
    assert "[smoke] running again: the previous run stopped during this step" in third.stderr
    assert _statuses(work)["smoke"] == "ok"
    assert not (work / LOCK_NAME).exists()  # a run that ends removes its lock file


def test_the_lock_is_held_from_the_library_too(tmp_path, demo_model, e2e_cli):
    """`pypto_e2e.run` (what the CLI and the demo call) holds the lock: a run inside a
    held work dir is refused, and the holder named."""
    from pypto_e2e.workdir import held_work_dir

    work = tmp_path / "work"
    with held_work_dir(work):
        rc, out, err = e2e_cli(
            "run", "--work-dir", str(work), "--model-path", str(demo_model), "--skip", ONLY_PATCH
        )
        assert (work / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    assert rc == EXIT.WORK_DIR_BUSY
    assert out == ""
    assert f"pid {os.getpid()})" in err
    assert not (work / MANIFEST_NAME).exists()
    rc, _out, err = e2e_cli(
        "run", "--work-dir", str(work), "--model-path", str(demo_model), "--skip", ONLY_PATCH
    )
    assert rc == EXIT.OK, err
    assert sorted(p.name for p in work.iterdir()) == [MANIFEST_NAME]


# ------------------------------------------------------------------ item 12: unusable
def _sys_is_read_only() -> bool:
    """/sys refuses new files even to root (sysfs); checked, never assumed."""
    probe = Path("/sys/pypto-e2e-probe")
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return Path("/sys").is_dir()
    os.close(fd)  # pragma: no cover - a writable /sys: clean up and skip
    probe.unlink()
    return False


def _unusable_work_dirs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Work dirs that cannot be used even by root (chmod does not stop root), with the
    text the error must name."""
    plain = tmp_path / "plain-file"
    plain.write_text("not a folder\n")
    missing = f"pypto-e2e-test-{os.getpid()}"
    cases = {
        # a regular file where the work dir (or one of its parents) should be
        "file-as-work-dir": (plain, f"{plain} is a file, not a folder"),
        "file-as-parent": (plain / "work", f"{plain} is a file, not a folder"),
        # procfs: no folder can be created in it
        "under-proc": (Path("/proc") / missing / "work", f"/proc/{missing}"),
    }
    if _sys_is_read_only():
        # an existing folder that refuses new files (sysfs): "read-only" for root
        cases["existing-unwritable"] = (Path("/sys"), "Permission denied")
    return cases


@pytest.mark.parametrize("case", ["file-as-work-dir", "file-as-parent", "under-proc", "existing"])
def test_an_unusable_work_dir_is_one_line_with_its_code_before_any_step(
    tmp_path, demo_model, case, e2e_cli, tree_state
):
    cases = _unusable_work_dirs(tmp_path)
    if case == "existing":
        if "existing-unwritable" not in cases:
            pytest.skip("/sys accepts new files here: no folder unwritable for root")
        case = "existing-unwritable"
    work, named = cases[case]
    before = tree_state(tmp_path)
    rc, out, err = e2e_cli(
        "run",
        "--work-dir",
        str(work),
        "--model-path",
        str(demo_model),
        "--skip",
        ONLY_PATCH,
        "--json",
    )
    assert rc == EXIT.WORK_DIR_UNUSABLE
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"pypto-e2e: error: cannot use {work} as the work dir")
    assert named in lines[0]
    assert "pass another --work-dir" in lines[0]
    assert "[patch]" not in err  # no step ran
    doc = json.loads(out)
    assert doc["error"]["name"] == "WORK_DIR_UNUSABLE"
    assert tree_state(tmp_path) == before
    assert not Path("/proc", f"pypto-e2e-test-{os.getpid()}").exists()


def test_the_work_dir_codes_are_pypto_e2e_s_own_and_name_the_fix():
    from pypto_common import EXIT_RANGES

    for name in ("WORK_DIR_UNUSABLE", "WORK_DIR_BUSY"):
        code = getattr(EXIT, name)
        assert code in EXIT_RANGES["pypto-e2e"]
        assert "--work-dir" in EXIT.meaning(code)
