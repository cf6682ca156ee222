"""The suite's time budget and its own measurements, for every package's tests.

Why here: the README's test command is what every contributor and CI run, so its cost is
a property of the whole suite, not of one package. This file (stdlib and pytest only, so
``nox -s "package(<name>)"`` loads it too) does two things:

- **The budget.** A test whose call takes longer than ``test_budget_s`` (pyproject's
  ``[tool.pytest.ini_options]``; ``PYPTO_TEST_BUDGET_S`` overrides it), or whose setup or
  teardown takes twice that (they hold the shared once-per-run builds), fails, unless it is marked ``@pytest.mark.slow(reason="...")``: a proof that needs minutes says
  why, and docs/testing.md lists it with its cost. ``PYPTO_TEST_BUDGET_S=0`` switches the
  guard off (to measure a suite that is known to be over it).
- **The measurements.** With ``PYPTO_TEST_PROFILE=<folder>`` every process (each xdist
  worker too) appends one JSON line per test: the seconds of each phase, the peak resident
  memory of this process during the test (the kernel's high-water mark, reset before the
  test) and after it, and the peak of any child process it waited for.
  ``tools/suite_profile.py`` turns the folder into docs/testing.md's tables.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import gc
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import pytest

__all__: list[str] = []

_DEFAULT_BUDGET_S = 90.0
_PHASES = ("setup", "call", "teardown")
_RECORD = pytest.StashKey[dict]()
_BUDGET = pytest.StashKey[float]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "test_budget_s",
        "seconds one phase of one test may take unless it is marked slow(reason=...)",
        default=str(_DEFAULT_BUDGET_S),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow(reason): needs more than the per-phase budget")
    config.addinivalue_line(
        "markers", "exclusive(reason): runs with no other test of the run beside it (memory)"
    )
    config.stash[_BUDGET] = _budget(config)


def _budget(config: pytest.Config) -> float:
    raw = os.environ.get("PYPTO_TEST_BUDGET_S") or str(config.getini("test_budget_s"))
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(
            f"PYPTO_TEST_BUDGET_S / test_budget_s is {raw!r}: give seconds, e.g. 90 (0 = off)"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise pytest.UsageError(f"test budget {raw!r}: give a finite number of seconds >= 0")
    return value


def _status_kib(field: str) -> int | None:
    """One ``VmRSS`` / ``VmHWM`` line of /proc/self/status, in KiB (None off Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> None:
    """Reset this process's resident high-water mark (Linux >= 4.0: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        pass


def slow_reason(item: pytest.Item) -> str | None:
    """The reason of the item's ``slow`` mark, or None when it has none (or no mark).

    Every ``slow`` mark is read, not only the closest: a bare ``slow`` on a parametrized
    function is closer than the ``slow(reason=...)`` one of its ``pytest.param`` cases."""
    for mark in item.iter_markers("slow"):
        reason = str(mark.kwargs.get("reason") or (mark.args[0] if mark.args else "")).strip()
        if reason:
            return reason
    return None


def _give_back_memory() -> None:
    """Free what the finished module's objects held and hand freed heap pages to the OS.

    Why: a worker runs hundreds of modules; glibc keeps freed heap memory (tensors under
    its mmap threshold, Python objects) resident, so each worker's RSS only grew and the
    two workers plus a test's child went past the suite's 8 GB. ``malloc_trim(0)`` returns
    the free pages (glibc only; elsewhere this is a garbage collection).
    """
    gc.collect()
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc.malloc_trim(0)


_libc: ctypes.CDLL | bool | None = None


def _room(config: pytest.Config) -> tuple[Path, Path] | None:
    """The two lock files all xdist workers of one run share (None outside xdist)."""
    uid = getattr(config, "workerinput", {}).get("testrunuid")
    if not isinstance(uid, str) or not uid.isalnum():
        return None
    folder = os.environ.get("PYPTO_TEST_PROFILE") or tempfile.gettempdir()
    Path(folder).mkdir(parents=True, exist_ok=True)
    base = Path(folder) / f"pypto-suite-{uid}"
    return base.with_suffix(".turnstile"), base.with_suffix(".room")


def _enter(item: pytest.Item) -> object | None:
    """Hold the run's room: shared by every test, alone by an ``exclusive`` one.

    Why: a test marked ``@pytest.mark.exclusive(reason=...)`` needs most of the suite's
    memory budget (a full-shape precision case's child holds ~11 GB); under two workers it
    must not overlap anything else. A reader-writer lock over ``flock``: every test takes
    the turnstile briefly, then the room shared; an exclusive one keeps the turnstile until
    it has the room to itself, so the other worker queues behind it instead of starving it.
    """
    paths = _room(item.config)
    if paths is None:
        return None
    turnstile_path, room_path = paths
    alone = item.get_closest_marker("exclusive") is not None
    deadline = time.monotonic() + _LOCK_WAIT_S
    with open(turnstile_path, "a", encoding="ascii") as turnstile:
        room = open(room_path, "a", encoding="ascii")  # noqa: SIM115 (held past this block)
        if _lock(turnstile, fcntl.LOCK_EX, deadline) and _lock(
            room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH, deadline
        ):
            return room
    room.close()
    sys.stderr.write(
        f"{item.nodeid}: waited {_LOCK_WAIT_S:g} s for the other worker's test; running it "
        "without the exclusive lock (the memory peak may overlap)\n"
    )
    return None


#: The longest a test waits for the run's room (one test of the other worker, or an
#: exclusive one): past it the test runs anyway rather than hang the suite
#: (``PYPTO_TEST_LOCK_WAIT_S`` overrides it).
_LOCK_WAIT_S = float(os.environ.get("PYPTO_TEST_LOCK_WAIT_S") or 1800)


def _lock(fh: object, kind: int, deadline: float) -> bool:
    """``flock`` without blocking past ``deadline`` (polled; SIGTERM still ends the wait)."""
    while True:
        try:
            fcntl.flock(fh, kind | fcntl.LOCK_NB)  # type: ignore[arg-type]
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    room = _enter(item)
    try:
        yield from _protocol(item, nextitem)
    finally:
        if room is not None:
            room.close()  # type: ignore[attr-defined]  # closing the file drops its flock


def _protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _reset_peak()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    item.stash[_RECORD] = {"start": time.time()}
    yield
    if nextitem is None or nextitem.path != item.path:
        _give_back_memory()
    record = item.stash[_RECORD]
    folder = os.environ.get("PYPTO_TEST_PROFILE")
    if not folder:
        return
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    peak = _status_kib("VmHWM")
    rss = _status_kib("VmRSS")
    line = {
        "nodeid": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "start": record["start"],
        **{phase: round(record.get(phase, 0.0), 3) for phase in _PHASES},
        "outcome": record.get("outcome", "unknown"),
        "error": record.get("error"),
        "peak_mib": round(peak / 1024, 1) if peak is not None else None,
        "rss_after_mib": round(rss / 1024, 1) if rss is not None else None,
        # ru_maxrss of children is the largest child so far: a new maximum is this test's.
        "child_peak_mib": round(children_after / 1024, 1)
        if children_after > children_before
        else None,
        "slow": slow_reason(item),
        "fixtures": list(getattr(item, "fixturenames", ())),
    }
    _append(line)


def _append(line: dict) -> None:
    folder = os.environ.get("PYPTO_TEST_PROFILE")
    if not folder:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = Path(folder) / f"profile-{worker}-{os.getpid()}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    """Each fixture's own setup time: a session fixture is paid by whichever test is first."""
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    if seconds >= 0.5 and os.environ.get("PYPTO_TEST_PROFILE"):
        _append(
            {
                "fixture": fixturedef.argname,
                "scope": fixturedef.scope,
                "baseid": fixturedef.baseid,
                "seconds": round(seconds, 3),
                "nodeid": request.node.nodeid,
                "peak_mib": round((_status_kib("VmHWM") or 0) / 1024, 1),
            }
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    record = item.stash.get(_RECORD, None)
    if record is None:
        return
    record[call.when] = report.duration
    if report.failed:
        record["outcome"] = "failed"
        crash = getattr(report.longrepr, "reprcrash", None)
        record["error"] = str(getattr(crash, "message", "") or report.longrepr)[:500]
    elif report.skipped and call.when != "teardown":
        record["outcome"] = "skipped"
    elif call.when == "call" and report.passed:
        record["outcome"] = "passed"
    budget = item.config.stash[_BUDGET]
    if call.when != "call":
        # Setup and teardown hold the shared once-per-run builds (a session fixture, PyPTO's
        # calculator) that land on whichever test asks first: twice the budget.
        budget *= 2
    if not budget or report.duration <= budget or report.failed or report.skipped:
        return
    if slow_reason(item) is not None:
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{item.nodeid}: its {call.when} took {report.duration:.1f} s, over the suite's "
        f"budget of {budget:g} s for it (pyproject's test_budget_s; twice that for setup and teardown): make it cheaper "
        "(share the fixture per session, a smaller size that proves the same) or mark it "
        '@pytest.mark.slow(reason="why it needs the time") and list it in docs/testing.md'
    )
    # The profile line says what the terminal says: failed by the budget.
    record["outcome"] = "failed"
    record["error"] = f"over the budget: {call.when} {report.duration:.1f} s > {budget:g} s"
