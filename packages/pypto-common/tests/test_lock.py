"""pypto_common.lock: the one folder lock of pypto-download and pypto-e2e, with real
processes holding it, dying by SIGKILL, and leaving a forked child behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pypto_common.lock import FileLock, LockHeldError, make_dirs

# A holder: takes the lock, says so, then sleeps until killed. With "fork" its child
# inherits the descriptor and outlives it (what an orphaned worker process does).
HOLDER = textwrap.dedent(
    """
    import os, sys, time
    from pypto_common.lock import FileLock
    lock = FileLock(sys.argv[1])
    lock.acquire()
    if sys.argv[2] == "fork" and os.fork() == 0:
        time.sleep(120)
        os._exit(0)
    print("locked", flush=True)
    time.sleep(120)
    """
)


def _holder(path: Path, mode: str = "hold") -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), mode],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # so the forked child can be killed with its group
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    if proc.stdout:
        proc.stdout.close()


def test_a_live_holder_is_named_and_sigkill_releases_the_lock(tmp_path):
    path = tmp_path / "lock"
    holder = _holder(path)
    try:
        with pytest.raises(LockHeldError) as info:
            FileLock(path).acquire()
        assert info.value.holder == holder.pid
        assert info.value.holder_alive
        assert info.value.describe() == f"pid {holder.pid}"
        assert path.read_text() == f"{holder.pid}\n"  # the refused attempt wrote nothing
    finally:
        holder.kill()  # SIGKILL: no release, no cleanup
        holder.wait(timeout=30)
        if holder.stdout:
            holder.stdout.close()
    with FileLock(path) as lock:  # the kernel dropped the dead holder's lock
        assert lock.held
        assert path.read_text() == f"{os.getpid()}\n"
    assert not lock.held


def test_a_lock_kept_by_a_forked_child_says_its_starter_has_exited(tmp_path):
    path = tmp_path / "lock"
    holder = _holder(path, "fork")
    try:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        with pytest.raises(LockHeldError) as info:
            FileLock(path).acquire()
        assert info.value.holder == holder.pid
        assert not info.value.holder_alive
        assert "has exited" in info.value.describe()
    finally:
        _kill_group(holder)
    deadline = time.monotonic() + 30
    while True:  # the child is gone once its group is killed: the lock is free
        try:
            FileLock(path).acquire()
            break
        except LockHeldError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


# Contenders: each takes the lock (retrying while busy) many times; inside, it creates a
# marker with O_EXCL, which fails if anyone else is inside too.
CONTENDER = textwrap.dedent(
    """
    import os, sys
    from pypto_common.lock import FileLock, LockHeldError
    lock_path, marker, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    done = 0
    while done < rounds:
        lock = FileLock(lock_path, remove_on_release=True)
        try:
            lock.acquire()
        except LockHeldError:
            continue
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            print("two holders at once", flush=True)
            sys.exit(1)
        os.close(fd)
        os.unlink(marker)
        lock.release()
        done += 1
    """
)


def test_a_lock_file_removed_on_release_never_lets_two_processes_in(tmp_path):
    """Unlinking on release is safe only because a process that locked the old file
    re-checks the path and starts again: real processes contend for it."""
    lock_path, marker = tmp_path / "lock", tmp_path / "inside"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONTENDER, str(lock_path), str(marker), "150"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    assert not lock_path.exists()  # each holder removed it on release
    assert not marker.exists()


def test_an_unopenable_lock_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        FileLock(tmp_path / "missing-folder" / "lock").acquire()


def test_make_dirs_reports_what_it_created_and_names_a_file_in_the_way(tmp_path):
    assert make_dirs(tmp_path) is None
    target = tmp_path / "a" / "b" / "c"
    assert make_dirs(target) == tmp_path / "a"
    assert target.is_dir()
    assert make_dirs(target) is None
    plain = tmp_path / "plain"
    plain.write_text("x")
    for bad in (plain, plain / "sub"):
        with pytest.raises(NotADirectoryError) as info:
            make_dirs(bad)
        assert info.value.filename == str(plain)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "plain"]
