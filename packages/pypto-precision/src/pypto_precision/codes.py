"""The exit codes of the ``pypto-precision`` command (its range in pypto_common's table).

Read them by name (``pypto_precision.EXIT.DIVERGED``); docs/exit-codes.md is generated from
this table.
"""

from __future__ import annotations

from pypto_common import ExitCodeTable

__all__ = ["EXIT"]

EXIT = ExitCodeTable(
    "pypto-precision",
    [
        (1, "FAILED", "the dump or check could not run the model (the message names the error)"),
        (
            2,
            "USAGE",
            "bad usage: an unknown flag or value, an output folder that exists, a missing dump "
            "folder",
        ),
        (
            3,
            "ENVIRONMENT",
            "a command needs what is not installed (`dump` and `check` need pypto-bench) or "
            "a device that is not here",
        ),
        (
            100,
            "DIVERGED",
            "the compare ran: an entry or the logits are past the rule (the report names the "
            "first diverging module and the metric that decided it)",
        ),
        (
            101,
            "BAD_DUMP",
            "a dump folder is unreadable, hostile or not a dump (a path outside it, a file "
            "that is not regular, an index over its bounds); nothing was compared",
        ),
        (
            102,
            "NOT_COMPARABLE",
            "the two dumps share no entry, or were made from different inputs (token ids)",
        ),
        (103, "TOO_LARGE", "a tensor-mode dump would pass --max-bytes; nothing was kept"),
    ],
)
