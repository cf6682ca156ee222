"""The suite's own budget and measurements (docs/testing.md): the root conftest.py's
per-phase guard in a real pytest process, tools/suite_profile.py on real and hostile
profile lines, and tools/measure_tests.py on a real process tree and a real signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import measure_tests  # noqa: E402
import suite_profile  # noqa: E402

TESTS = textwrap.dedent(
    """
    import time
    import pytest

    @pytest.fixture
    def slow_fixture():
        time.sleep(1.6)
        return 1

    def test_quick():
        pass

    def test_over_budget():
        time.sleep(1.2)

    @pytest.mark.slow(reason="a real child process must be killed and reaped")
    def test_slow_with_reason():
        time.sleep(1.2)

    @pytest.mark.slow
    def test_slow_without_reason():
        time.sleep(1.2)

    def test_fixture_over_budget(slow_fixture):
        pass

    @pytest.mark.slow
    @pytest.mark.parametrize(
        "case",
        [pytest.param("heavy", marks=pytest.mark.slow(reason="one case compiles more")), "light"],
    )
    def test_param(case):
        time.sleep(1.2)
    """
)


def _own_rootdir(folder: Path) -> None:
    """An ini file of its own, so the inner pytest's rootdir is ``folder`` wherever the temp
    folder lives: under the checkout (nox's TMPDIR is ``.nox/tests/tmp``) pytest would
    otherwise find the root pyproject.toml and load the root conftest.py a second time
    beside ``-p conftest`` (two registrations, each taking the room lock: a deadlock)."""
    (folder / "pytest.ini").write_text("[pytest]\n")


def _pytest(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A real pytest over ``TESTS`` with the root conftest.py loaded as a plugin."""
    (tmp_path / "test_budgeted.py").write_text(TESTS)
    _own_rootdir(tmp_path)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYPTO_TEST", "PYTEST"))}
    clean["PYTHONPATH"] = os.pathsep.join([str(ROOT), clean.get("PYTHONPATH", "")])
    clean.update(env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-rA",
         "-W", "ignore::pytest.PytestUnknownMarkWarning", *args, str(tmp_path)],
        cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _outcomes(stdout: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        for word in ("PASSED", "FAILED", "ERROR"):
            if line.startswith(word + " "):
                name = line.split()[1].split("::")[-1]
                found.setdefault(name, word)
    return found


def test_a_phase_over_the_budget_fails_unless_slow_with_a_reason(tmp_path):
    done = _pytest(tmp_path, PYPTO_TEST_BUDGET_S="0.6")
    got = _outcomes(done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert got["test_quick"] == "PASSED"
    assert got["test_slow_with_reason"] == "PASSED"
    assert got["test_over_budget"] == "FAILED"
    assert got["test_slow_without_reason"] == "FAILED"
    # a fixture's setup over the budget is the test's setup: an error, named as setup
    assert got["test_fixture_over_budget"] == "ERROR"
    # a case's slow(reason=...) counts under the function's bare slow mark, the others' not
    assert got["test_param[heavy]"] == "PASSED"
    assert got["test_param[light]"] == "FAILED"
    assert "its call took" in done.stdout
    assert "its setup took" in done.stdout
    assert "over the suite's budget of 0.6 s for it" in done.stdout
    assert '@pytest.mark.slow(reason="why it needs the time")' in done.stdout


def test_a_test_failed_by_the_budget_is_failed_in_its_profile_line(tmp_path):
    """The terminal said F while the profile line said passed (the run's tables then hid
    the tests the guard failed)."""
    profile = tmp_path / "profile"
    done = _pytest(tmp_path, "-k", "over_budget and not fixture", PYPTO_TEST_BUDGET_S="0.6",
                   PYPTO_TEST_PROFILE=str(profile))  # fmt: skip
    assert done.returncode == 1, done.stdout
    tests, _, _ = suite_profile.load(profile)
    (row,) = [t for t in tests if t["nodeid"].endswith("test_over_budget")]
    assert row["outcome"] == "failed"
    assert "over the budget" in row["error"]


def test_the_budget_off_and_a_bad_budget(tmp_path):
    off = _pytest(tmp_path, PYPTO_TEST_BUDGET_S="0")
    assert off.returncode == 0, off.stdout
    assert set(_outcomes(off.stdout).values()) == {"PASSED"}
    for bad in ("ninety", "nan", "-1"):
        done = _pytest(tmp_path, PYPTO_TEST_BUDGET_S=bad)
        assert done.returncode == 4, (bad, done.stdout, done.stderr)  # pytest's usage error
        assert "give" in done.stderr, done.stderr
        assert "seconds" in done.stderr, done.stderr
        assert len([ln for ln in done.stderr.splitlines() if "ERROR" in ln]) == 1


def test_suite_profile_lines_are_written_and_rendered(tmp_path):
    profile = tmp_path / "profile"
    done = _pytest(
        tmp_path,
        "-k", "quick or over_budget or fixture_over",
        PYPTO_TEST_BUDGET_S="0", PYPTO_TEST_PROFILE=str(profile),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    tests, fixtures, skipped = suite_profile.load(profile)
    by_name = {t["nodeid"].split("::")[-1]: t for t in tests}
    assert set(by_name) == {"test_quick", "test_over_budget", "test_fixture_over_budget"}
    assert by_name["test_over_budget"]["call"] >= 1.2
    assert by_name["test_fixture_over_budget"]["setup"] >= 1.6
    assert by_name["test_quick"]["peak_mib"] > 0
    assert [f["fixture"] for f in fixtures] == ["slow_fixture"]
    assert fixtures[0]["seconds"] >= 1.6
    assert skipped == 0
    # hostile lines are counted and skipped, never trusted
    with (profile / "profile-x-1.jsonl").open("w") as fh:
        fh.write("not json\n[1, 2]\n")
        fh.write(json.dumps({"nodeid": "a", "setup": "NaN", "call": 0, "teardown": 0}) + "\n")
        fh.write('{"nodeid": "b", "setup": NaN, "call": 0, "teardown": 0}\n')
        fh.write(json.dumps({"fixture": "f", "seconds": "1e308"}) + "\n")
    tests2, _, skipped2 = suite_profile.load(profile)
    assert len(tests2) == 3
    assert skipped2 == 5
    page = suite_profile.render(profile, top=5)
    assert "3 tests (3 passed)" in page
    assert "5 unreadable lines skipped" in page
    assert "`slow_fixture`" in page
    assert "test_over_budget" in page
    cli = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "suite_profile.py"), str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert cli.returncode == 2
    assert "is not a folder" in cli.stderr
    assert not cli.stdout


EXCLUSIVE = textwrap.dedent(
    """
    import json, os, time
    import pytest

    def _log(name, t0, t1):
        with open(os.environ["SPANS"], "a") as fh:
            fh.write(json.dumps([name, t0, t1]) + "\\n")

    @pytest.mark.parametrize("i", range(6))
    def test_plain(i):
        t0 = time.time(); time.sleep(0.4); _log(f"plain{i}", t0, time.time())

    @pytest.mark.exclusive(reason="holds most of the memory budget")
    def test_alone():
        t0 = time.time(); time.sleep(1.5); _log("alone", t0, time.time())

    @pytest.mark.parametrize("i", range(6))
    def test_plain_after(i):
        t0 = time.time(); time.sleep(0.4); _log(f"after{i}", t0, time.time())
    """
)


def test_an_exclusive_test_runs_with_no_other_test_beside_it(tmp_path):
    pytest.importorskip("xdist")
    (tmp_path / "test_exclusive.py").write_text(EXCLUSIVE)
    _own_rootdir(tmp_path)
    spans = tmp_path / "spans.jsonl"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYPTO_TEST", "PYTEST"))}
    clean.update(PYTHONPATH=str(ROOT), SPANS=str(spans), PYPTO_TEST_PROFILE=str(tmp_path / "p"))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider",
         "-n", "2", "--dist", "load", str(tmp_path / "test_exclusive.py")],
        cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in spans.read_text().splitlines()]
    assert len(rows) == 13
    (alone,) = [r for r in rows if r[0] == "alone"]
    others = [r for r in rows if r[0] != "alone"]
    # both workers ran plain tests side by side, and none of them beside the exclusive one
    assert any(a[1] < b[2] and b[1] < a[2] for a in others for b in others if a is not b)
    overlapping = [r[0] for r in others if r[1] < alone[2] and alone[1] < r[2]]
    assert overlapping == [], overlapping


def test_the_room_lock_wait_is_bounded(tmp_path):
    """A held room (a stuck test on the other worker) delays a test by the stated bound, not
    forever: the lock is polled, never a blocking flock."""
    import fcntl
    import importlib.util

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    room = tmp_path / "room"
    with room.open("a") as held, room.open("a") as waiter:
        fcntl.flock(held, fcntl.LOCK_EX)
        start = time.monotonic()
        assert module._lock(waiter, fcntl.LOCK_SH, start + 0.5) is False
        assert 0.5 <= time.monotonic() - start < 5
        fcntl.flock(held, fcntl.LOCK_UN)
        assert module._lock(waiter, fcntl.LOCK_SH, time.monotonic() + 0.5) is True


def test_measure_tests_sees_a_child_and_passes_its_exit_status(tmp_path):
    csv = tmp_path / "rss.csv"
    grow = (
        "import subprocess, sys\n"
        'code = \'import time; b = bytearray(300 << 20); b[::4096] = b"x" * len(b[::4096]);'
        " time.sleep(2)'\n"
        "sys.exit(subprocess.run([sys.executable, '-c', code]).returncode + 3)\n"
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "measure_tests.py"), "--csv", str(csv),
         "--every", "0.2", "--", sys.executable, "-c", grow, "--token", "hf_SECRETabc123"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    summary = json.loads(done.stdout)
    assert summary["exit"] == 3
    assert "hf_SECRET" not in done.stdout + done.stderr + csv.read_text()  # never echoed
    # the child's 300 MiB is counted with its parent's (a one-process ru_maxrss would not)
    assert summary["peak_rss_mib"] >= 300, summary
    rows = csv.read_text().splitlines()
    assert rows[0] == "seconds,processes,rss_mib,pss_mib"
    assert len(rows) > 3
    assert max(int(r.split(",")[1]) for r in rows[1:]) >= 2  # parent and child seen


def test_measure_tests_forwards_sigterm_to_the_whole_tree(tmp_path):
    pidfile = tmp_path / "child.pid"
    tree = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(300)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tools" / "measure_tests.py"), "--csv",
         str(tmp_path / "rss.csv"), "--", sys.executable, "-c", tree],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline, "the tree never started"
        time.sleep(0.1)
    grandchild = int(pidfile.read_text())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert json.loads(out)["exit"] == -signal.SIGTERM
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(grandchild, signal.SIGKILL)
        pytest.fail("the grandchild outlived measure_tests.py's SIGTERM")


@pytest.mark.parametrize(
    "argv", [[], ["--csv", "x.csv"], ["--csv", "x", "--every", "0", "--", "true"]]
)
def test_measure_tests_bad_usage_exits_2(tmp_path, argv):
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "measure_tests.py"), *argv],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert not done.stdout
    assert not list(tmp_path.iterdir())  # nothing written


def test_tree_memory_of_this_process():
    count, rss, pss = measure_tests.tree_memory(os.getpid())
    assert count >= 1
    assert rss > 10
    assert pss > 0


def test_the_docs_state_the_budget_the_suite_enforces():
    """docs/testing.md and the README name the numbers and tools the suite really uses."""
    import tomllib

    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    budget = float(ini["test_budget_s"])
    page = (ROOT / "docs" / "testing.md").read_text()
    assert f"`test_budget_s` ({budget:g} s" in page
    for tool in ("tools/measure_tests.py", "tools/suite_profile.py", "conftest.py"):
        assert tool in page
        assert (ROOT / tool).is_file()
    noxfile = (ROOT / "noxfile.py").read_text()
    assert 'XDIST_ARGS = ("-n", "2", "--dist", "worksteal")' in noxfile
    assert 'WORKER_ENV = {"OMP_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}' in noxfile
    assert "`-n 2 --dist worksteal`" in page
    assert "`OMP_NUM_THREADS=1`" in page
    assert "`TORCHINDUCTOR_COMPILE_THREADS=1`" in page
    assert "nox -s tests -- -n 0" in page
    assert "(docs/testing.md)" in (ROOT / "README.md").read_text()
