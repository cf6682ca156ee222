"""A child that ends with its parent, however the parent ends (pypto_common.parent): real
processes, a parent killed with SIGKILL or SIGTERM (whose default action runs no cleanup),
and the child noticing by the parent-death signal, by the polling watch alone, or both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "\nState:\tZ" not in status


_FAMILY = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())] + sys.argv[2:])
print(child.pid, flush=True)
time.sleep(600)
"""


def _orphan(child_code: str, *args: str) -> tuple[int, subprocess.Popen[str]]:
    """Start parent -> child; return (child pid, parent) once the child is armed."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _FAMILY, textwrap.dedent(child_code), *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    return child, parent


def _kill_parent_once_armed(child: int, parent: subprocess.Popen[str], armed: Path) -> bool:
    """SIGKILL the parent once the child has written ``armed``; True when the child has
    ended within 5 s (it is killed here either way, never left running)."""
    try:
        deadline = time.monotonic() + 60
        while not armed.exists():
            assert time.monotonic() < deadline, "the child never armed itself"
            time.sleep(0.05)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while alive(child):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_watch_ends_a_child_whose_parent_was_killed_without_the_signal(tmp_path):
    """The portable mechanism: no parent-death signal is set, the polling thread alone
    notices the parent's SIGKILL and runs the child's cleanup."""
    marker = tmp_path / "cleaned"
    armed = tmp_path / "armed"
    child, parent = _orphan(
        """
        import os, sys, time
        from pathlib import Path
        from pypto_common.parent import watch_parent
        def died():
            Path(sys.argv[2]).write_text("parent gone")
            os._exit(0)
        watch_parent(int(sys.argv[1]), died, poll_s=0.05)
        Path(sys.argv[3]).write_text("armed")
        time.sleep(600)
        """,
        str(marker),
        str(armed),
    )
    assert _kill_parent_once_armed(child, parent, armed)
    assert marker.read_text() == "parent gone"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux only")
def test_the_parent_death_signal_ends_a_child_that_does_nothing_else(tmp_path):
    armed = tmp_path / "armed"
    child, parent = _orphan(
        """
        import signal, sys, time
        from pathlib import Path
        from pypto_common.parent import set_parent_death_signal
        assert set_parent_death_signal(signal.SIGKILL)
        Path(sys.argv[2]).write_text("armed")
        time.sleep(600)
        """,
        str(armed),
    )
    assert _kill_parent_once_armed(child, parent, armed)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_end_with_parent_takes_the_child_s_whole_group_along(tmp_path, how):
    """A child in a session of its own (as a precision child is) with a grandchild: the
    parent killed outright, both end within seconds."""
    armed = tmp_path / "armed"
    child, parent = _orphan(
        """
        import os, subprocess, sys, time
        from pathlib import Path
        from pypto_common.parent import end_with_parent
        os.setsid()
        end_with_parent(int(sys.argv[1]), poll_s=0.05)
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(sys.argv[2]).write_text(str(grandchild.pid))
        time.sleep(600)
        """,
        str(armed),
    )
    deadline = time.monotonic() + 60
    while not (armed.exists() and armed.read_text()):
        assert time.monotonic() < deadline, "the child never armed itself"
        time.sleep(0.05)
    grandchild = int(armed.read_text())
    try:
        parent.send_signal(how)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while (alive(child) or alive(grandchild)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child)
        assert not alive(grandchild)
    finally:
        for pid in (child, grandchild):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_end_with_parent_ends_at_once_when_the_parent_is_already_gone(tmp_path):
    """The parent's pid given is not this process's parent (it died before the child armed
    itself): the child ends right away, before running anything else."""
    marker = tmp_path / "ran on"
    code = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from pypto_common.parent import end_with_parent
        end_with_parent(os.getppid() + 1_000_000)
        Path({str(marker)!r}).write_text("ran on")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], timeout=60, check=False)
    assert done.returncode == -signal.SIGKILL
    assert not marker.exists()
