"""Old home of "nothing a run starts outlives the process that started it" (kept so every
existing import keeps working): the code lives in :mod:`pypto_bench.multi.lifecycle`."""

from __future__ import annotations

from .multi.lifecycle import (
    PARENT_POLL_S,
    TERMINATED_EXIT,
    Terminated,
    end_group_members,
    group_stats,
    live_group_members,
    proc_stat,
    set_parent_death_signal,
    sigterm_as_interrupt,
    watch_parent,
)

__all__ = [
    "PARENT_POLL_S",
    "TERMINATED_EXIT",
    "Terminated",
    "end_group_members",
    "group_stats",
    "live_group_members",
    "proc_stat",
    "set_parent_death_signal",
    "sigterm_as_interrupt",
    "watch_parent",
]
