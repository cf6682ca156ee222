"""``pypto-doctor``'s exit codes, read by name (``EXIT.UNKNOWN_CANN``), never by number.

The numbers come from the project's per-tool ranges (pypto-doctor owns 50-59), so a
script that chains the tools never sees one code mean two things.
"""

from __future__ import annotations

from pypto_common import ExitCodeTable

__all__ = ["EXIT"]

EXIT = ExitCodeTable(
    "pypto-doctor",
    [
        (
            0,
            "OK",
            "installed torch / torch_npu consistent with the CANN, or not installed yet "
            "(run the printed line)",
        ),
        (
            1,
            "FAILED",
            "installed torch / torch_npu do not match the CANN (the printed line fixes it)",
        ),
        (2, "USAGE", "bad input: --cann names a version the matrix does not know"),
        (
            3,
            "ENVIRONMENT",
            "no CANN toolkit found: source CANN's set_env.sh, export ASCEND_HOME_PATH, or pass --cann",
        ),
        (
            50,
            "UNKNOWN_CANN",
            "a CANN toolkit was detected but the matrix does not document its version",
        ),
    ],
)
