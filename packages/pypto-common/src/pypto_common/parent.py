"""A child process that ends when the process that started it ends, however that ends.

A parent killed outright (SIGKILL from ``timeout -s KILL``, the OOM killer, a pytest
worker ended by SIGTERM, whose default action kills without unwinding) runs no cleanup,
so a child it started in a session of its own keeps running: a rank of a multi-node run,
a precision child holding gigabytes. Two independent means let the child notice by itself:

* the Linux parent-death signal (``prctl(PR_SET_PDEATHSIG)``), set by the child as it
  starts, then a check that its parent is still the one expected (a parent that died
  before the call never sends it). Linux sends it when the *thread* that started the
  child ends, so the parent must start it from a thread that lives as long as it does;
* a daemon thread polling ``os.getppid()``: a child whose parent ended is re-parented (to
  init or a subreaper), so the pid changes. It works where the signal does not (other
  systems, a signal lost to a thread that exited).

pypto-bench's multi-rank launcher and ranks, and pypto-kernels-common's precision child,
use these. Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

__all__ = [
    "PARENT_POLL_S",
    "end_with_parent",
    "set_parent_death_signal",
    "watch_parent",
]

#: ``prctl`` option of <linux/prctl.h>: the signal sent when the parent thread ends.
_PR_SET_PDEATHSIG = 1
#: Seconds between two ``getppid()`` checks of the watching thread.
PARENT_POLL_S = 0.2


def set_parent_death_signal(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent ends; False where the
    call is unavailable (not Linux, no libc). Call it early, then check the parent is
    still the expected one: a parent already gone never sends it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(
    parent_pid: int, on_death: Callable[[], None], *, poll_s: float = PARENT_POLL_S
) -> threading.Thread:
    """A daemon thread that calls ``on_death()`` once, as soon as this process's parent
    is no longer ``parent_pid`` (immediately when it already is not)."""

    def run() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        on_death()

    thread = threading.Thread(target=run, name="pypto-parent-watch", daemon=True)
    thread.start()
    return thread


def _end_this_process() -> None:
    """SIGKILL this process's group when it leads one (what it started goes with it),
    else this process alone."""
    pgid = os.getpgrp()
    if pgid == os.getpid():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _close_inherited_fds() -> None:
    fds = [int(n) for n in os.listdir("/proc/self/fd") if n.isdigit()]
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _start_group_watchdog(poll_s: float) -> None:
    """Fork a small process into this group that SIGKILLs the group once this process has
    ended, whatever ended it. The parent-death signal kills this process at once, before
    it could end what it started; the watchdog, a process of its own, does that part. It
    holds none of this process's files (a pipe's reader must not wait for it)."""
    leader = os.getpid()
    if os.fork():
        return
    try:  # the watchdog: no imports, no threads, nothing but waiting
        _close_inherited_fds()
        while os.getppid() == leader:
            time.sleep(poll_s)
        os.killpg(leader, signal.SIGKILL)
    finally:
        os._exit(0)


def end_with_parent(parent_pid: int, *, poll_s: float = PARENT_POLL_S) -> bool:
    """End this process (SIGKILL) once ``parent_pid`` is no longer its parent, and when it
    leads a process group (a session of its own), everything in that group with it.

    For a child that has nothing to clean up and holds what must not outlive its parent
    (memory, a port). Call it first thing, before threads start (a group leader forks its
    watchdog here). Ends it at once when the parent is already gone. Returns whether the
    parent-death signal was set (the polling watch runs either way).
    """
    if sys.platform.startswith("linux") and os.getpgrp() == os.getpid():
        _start_group_watchdog(poll_s)
    armed = set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:
        _end_this_process()
    watch_parent(parent_pid, _end_this_process, poll_s=poll_s)
    return armed
