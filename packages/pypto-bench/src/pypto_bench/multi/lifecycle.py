"""Nothing a run starts outlives the process that started it.

A ``--nproc`` run is three generations of processes: the command (``pypto-bench run``),
the launcher it starts (torch's elastic agent, leading its own process group) and the
ranks the launcher spawns (with their own helpers in that group). Whatever ends a
parent (SIGKILL from ``timeout -s KILL``, a CI runner, the OOM killer), its children
notice within a fraction of a second by two independent means, the parent-death signal
and a thread polling the parent's pid (:mod:`pypto_common.parent`, shared with
pypto-kernels-common's precision child).

SIGTERM on the command is turned into :class:`Terminated` (a ``KeyboardInterrupt``), so
it unwinds like Ctrl-C: the launcher's group is ended, temporary folders are removed,
and the CLI exits with :data:`TERMINATED_EXIT` (128 + SIGTERM).

Also here: reading a process (group) out of ``/proc`` (state, CPU seconds, jiffies), which
the watchdog and the noise guard of a multi-rank run use.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..noise import LoadSampler

__all__ = [
    "EXIT_ORPHANED",
    "GROUP_METHOD",
    "ORPHAN_SIGNAL",
    "TERMINATED_EXIT",
    "Terminated",
    "cpu_seconds",
    "end_group_members",
    "group_jiffies",
    "group_load_sampler",
    "group_stats",
    "live_group_members",
    "proc_stat",
    "proc_state",
    "sigterm_as_interrupt",
]

log = logging.getLogger(__name__)

#: The shell's code for "ended by SIGTERM" (128 + 15).
TERMINATED_EXIT = 128 + int(signal.SIGTERM)
#: The launcher's parent-death signal (see :mod:`pypto_bench.multi.launch`): not one
#: torch's elastic agent handles (SIGTERM, SIGINT, SIGHUP, SIGQUIT), so the launcher's own
#: cleanup runs.
ORPHAN_SIGNAL = signal.SIGUSR1
#: The exit status of a launcher or rank that ended the run because its parent was gone.
EXIT_ORPHANED = 128 + int(ORPHAN_SIGNAL)


class Terminated(KeyboardInterrupt):
    """SIGTERM received: unwinds like Ctrl-C (cleanup runs), the CLI exits 143."""

    exit_code = TERMINATED_EXIT

    def __str__(self) -> str:
        return "terminated by SIGTERM"


def proc_stat(pid: Any) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first); None when
    the process is gone or the system has no ``/proc``."""
    try:
        return Path(f"/proc/{int(pid)}/stat").read_text().rpartition(")")[2].split()
    except (OSError, TypeError, ValueError):
        return None


def group_stats(pgid: int) -> Iterator[tuple[int, list[str]]]:
    """(pid, stat fields) of every process of group ``pgid`` (Linux ``/proc``; none elsewhere)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not (entry.name.isascii() and entry.name.isdigit()):
                continue
            rest = proc_stat(entry.name)
            with contextlib.suppress(IndexError, ValueError):
                if rest is not None and int(rest[2]) == pgid:
                    yield int(entry.name), rest


def live_group_members(pgid: int) -> list[int]:
    """Pids of the processes of group ``pgid`` that have not ended (zombies have)."""
    return [pid for pid, rest in group_stats(pgid) if rest[0] != "Z"]


def end_group_members(pgid: int, *, timeout: float = 10.0) -> None:
    """SIGKILL every live member of group ``pgid`` but this process, until none is left
    (members started meanwhile included) or ``timeout`` seconds have passed."""
    me = os.getpid()
    deadline = time.monotonic() + timeout
    while True:
        others = [p for p in live_group_members(pgid) if p != me]
        if not others or time.monotonic() > deadline:
            return
        for pid in others:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (a second
    one during the cleanup it starts is ignored). Outside the main thread: no change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the cleanup finish
        raise Terminated()

    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:  # nohup and the like: keep it
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def proc_state(pid: Any) -> str | None:
    """The one-letter state of process ``pid`` (``R``, ``S``, ``T`` stopped, ``Z``...), or
    None when it is gone."""
    rest = proc_stat(pid)
    return rest[0] if rest else None


def cpu_seconds(pid: Any) -> float | None:
    """User + system CPU seconds of process ``pid`` so far, or None when it is gone."""
    rest = proc_stat(pid)
    try:
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK") if rest else None
    except (ValueError, IndexError):
        return None


def group_jiffies(pgid: int) -> int:
    """CPU jiffies (own and reaped children's) of the live processes of group ``pgid``."""
    total = 0
    for _, rest in group_stats(pgid):
        with contextlib.suppress(ValueError):
            total += sum(int(x) for x in rest[11:15])
    return total


GROUP_METHOD = (
    "/proc/stat busy jiffies minus those of the run's process group (every rank, "
    "the launcher; utime+stime+cutime+cstime), over all cores' jiffies"
)


def group_load_sampler(pgid: int) -> LoadSampler:
    """``noise.LoadSampler`` for a run spread over processes: this run's own work is every
    process of the launcher's process group (each rank, the agent, their compile workers),
    so two ranks sharing the cores are not each other's "other load"."""
    from ..noise import LoadSampler

    return LoadSampler(lambda: group_jiffies(pgid), GROUP_METHOD)
