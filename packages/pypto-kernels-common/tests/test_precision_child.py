"""Precision cases in a child process: real children (the module itself, or a small
script), real timeouts, and no process left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pypto_kernels_common import precision_child
from pypto_kernels_common.precision_child import (
    PrecisionChildError,
    PrecisionChildTimeoutError,
    parse_rows,
    run_cases_in_child,
    run_child,
)

SUITE_SOURCE = '''
"""The toy package's precision suite, plus ops that misbehave on purpose."""
import os
import signal
import subprocess
import sys
import time

from pypto_kernels_common import PrecisionSuite
from toy_kernels import PACKAGE, add


def _add(kernel):
    def run(a, b):
        return {"out": add(a, b) if kernel else a + b}
    return run


def _bump(kernel):  # an in-place state, as linear-attention's: returned updated
    def run(state, step):
        return {"state": state + step}
    return run


def _die(kernel):
    def run(x):
        if kernel:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"y": x}
    return run


def _hang(kernel):
    def run(x):
        if kernel:
            sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            with open(os.environ["TOY_HANG_PID_FILE"], "w") as f:
                f.write(f"{os.getpid()} {sleeper.pid}")
            time.sleep(300)
        return {"y": x}
    return run


SUITE = PrecisionSuite("toy_precision", {"add": _add, "bump": _bump, "die": _die, "hang": _hang})
'''


def _case(cid: str, op: str, inputs: dict, outputs: list[str]) -> dict:
    return {
        "id": cid,
        "op": op,
        "description": "toy",
        "seed": 1,
        "inputs": inputs,
        "outputs": outputs,
        "rtol": 1e-5,
        "atol": 1e-5,
    }


F32 = {"shape": [16, 64], "dtype": "float32"}
CASES = {
    "schema_version": 1,
    "cases": [
        _case("add.small", "add", {"a": F32, "b": F32}, ["out"]),
        _case("bump.moved", "bump", {"state": F32, "step": {"value": 1.0}}, ["state"]),
        _case("bump.still", "bump", {"state": F32, "step": {"value": 0.0}}, ["state"]),
        _case("die.now", "die", {"x": F32}, ["y"]),
        _case("hang.forever", "hang", {"x": F32}, ["y"]),
    ],
}


@pytest.fixture
def toy_suite(tmp_path, toy_path, monkeypatch) -> str:
    """``toy_precision``: a real package with a cases resource, importable by the child."""
    root = tmp_path / "toy_precision"
    root.mkdir()
    (root / "__init__.py").write_text(SUITE_SOURCE)
    (root / "precision_cases.json").write_text(json.dumps(CASES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ["PYTHONPATH"]]))
    monkeypatch.setenv("TOY_HANG_PID_FILE", str(tmp_path / "hang.pid"))
    return "toy_precision"


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """The process ended (a zombie waiting for init to reap it counts as ended)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return True
        if "\nState:\tZ" in state:
            return True
        time.sleep(0.1)
    return False


def test_the_child_reports_outputs_moved_state_and_calls(toy_suite):
    rows = run_cases_in_child(toy_suite, ["bump.moved", "bump.still"], timeout_s=300)
    assert list(rows) == ["bump.moved", "bump.still"]
    moved, still = rows["bump.moved"], rows["bump.still"]
    assert moved["ok"], moved
    assert moved["error"] is None
    assert moved["moved"] == {"state": True}
    assert still["moved"] == {"state": False}
    assert moved["outputs"]["state"]["all_zero"] is False
    assert moved["outputs"]["state"]["max_abs_value"] > 0
    assert set(moved["max_abs"]) == {"state"}
    assert moved["calls"] is None  # bump is not one of the toy package's ops
    assert moved["pid"] != os.getpid()


def test_the_kernel_runs_through_the_sim_in_the_child(toy_suite, pypto_cpu):
    rows = run_cases_in_child(toy_suite, ["add.small"], timeout_s=600)
    row = rows["add.small"]
    assert row["ok"], row["error"]
    assert row["calls"] == {"pypto": 1, "reference": 0}, row["fallback_reasons"]
    assert row["outputs"]["out"]["all_zero"] is False
    assert row["max_abs"]["out"] <= 1e-5
    assert row["leftover_outputs"] == []


def test_an_unknown_case_id_is_named(toy_suite):
    with pytest.raises(
        PrecisionChildError, match=r"(?s)exited 3.*unknown case ids .*\['no\.such'\]"
    ):
        run_cases_in_child(toy_suite, ["bump.still", "no.such"], timeout_s=300)


def test_a_child_that_dies_is_an_error_with_the_rows_it_gave(toy_suite):
    with pytest.raises(PrecisionChildError, match="killed by SIGKILL") as info:
        run_cases_in_child(toy_suite, ["bump.still", "die.now"], timeout_s=300)
    assert list(info.value.rows) == ["bump.still"]
    assert "die.now" in str(info.value)


def test_a_child_past_its_timeout_is_killed_with_its_group(toy_suite):
    with pytest.raises(PrecisionChildTimeoutError, match=r"hang\.forever.*timed out after 0\.5 s"):
        run_cases_in_child(toy_suite, ["hang.forever"], timeout_s=0.5)


def test_a_timeout_kills_what_the_child_started(tmp_path):
    pid_file = tmp_path / "pid"
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pid_file)!r}, "w").write(str(p.pid))
        print("not a row", flush=True)
        time.sleep(300)
    """)
    start = time.monotonic()
    with pytest.raises(PrecisionChildTimeoutError, match=r"timed out after 3 s .*no rows"):
        run_child([sys.executable, "-c", script], timeout_s=3, expected_ids=["x"])
    assert time.monotonic() - start < 60
    assert _gone(int(pid_file.read_text()))


def test_garbage_on_stdout_is_not_a_row(tmp_path):
    script = "print('hello'); print('{not json'); print('{\"id\": \"x\"}'); print('[1]')"
    with pytest.raises(PrecisionChildError, match=r"exited 0 but gave no row for \['x'\]"):
        run_child([sys.executable, "-c", script], timeout_s=60, expected_ids=["x"])


def test_a_marked_row_of_the_wrong_shape_is_refused(tmp_path):
    script = "import json; print(json.dumps({'precision_child': 2, 'id': 'x', 'ok': True}))"
    with pytest.raises(PrecisionChildError, match=r"missing fields \['calls'"):
        run_child([sys.executable, "-c", script], timeout_s=60, expected_ids=["x"])


def test_rows_are_checked_field_by_field():
    good = {name: None for name in precision_child.ROW_FIELDS}
    good.update(
        precision_child=2, id="a", op="o", ok=True, fallback_reasons={}, outputs={}, moved={}
    )
    good.update(leftover_outputs=[], pid=7, seconds=0.1, peak_mib=812.5)
    line = json.dumps(good)
    assert parse_rows(f'noise\n{line}\n{{"other": 1}}\n') == [good]
    for field, bad in [
        ("ok", "yes"),
        ("pid", True),
        ("calls", []),
        ("precision_child", 1),
        ("peak_mib", "812"),
    ]:
        with pytest.raises(PrecisionChildError, match=field):
            parse_rows(json.dumps({**good, field: bad}))
    with pytest.raises(PrecisionChildError, match=r"unknown fields \['extra'\]"):
        parse_rows(json.dumps({**good, "extra": 1}))


def test_a_child_over_the_stdout_cap_is_refused(monkeypatch):
    monkeypatch.setattr(precision_child, "STDOUT_CAP", 1000)
    script = "print('x' * 5000)"
    with pytest.raises(PrecisionChildError, match="over the 1000-byte cap"):
        run_child([sys.executable, "-c", script], timeout_s=60)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_the_child_and_its_group_end_when_the_process_that_started_it_is_killed(
    toy_suite, tmp_path, how
):
    """A pytest worker killed outright (SIGTERM's default action runs no ``finally``) leaves
    its precision child, in a session of its own, without a parent: the child and what it
    started end within seconds (pypto_common.parent), not when their cases end."""
    pid_file = Path(os.environ["TOY_HANG_PID_FILE"])
    script = (
        "from pypto_kernels_common.precision_child import run_cases_in_child\n"
        f"run_cases_in_child({toy_suite!r}, ['hang.forever'], timeout_s=600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    child = grandchild = 0
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and len(pid_file.read_text().split()) == 2):
            assert parent.poll() is None, "the parent ended before its child started the case"
            assert time.monotonic() < deadline, "the child never reached its case"
            time.sleep(0.1)
        child, grandchild = (int(p) for p in pid_file.read_text().split())
        parent.send_signal(how)
        assert parent.wait(timeout=30) == -how  # killed outright: no cleanup of its own ran
        assert _gone(child)
        assert _gone(grandchild)
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in (child, grandchild):
            if pid:  # never left running, whatever failed above
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
