"""The exit codes of the ``pypto-capture`` command (its range in pypto_common's table).

Read them by name (``pypto_capture.EXIT.STAGE_FAILED``); docs/exit-codes.md is generated
from this table.
"""

from __future__ import annotations

from pypto_common import ExitCodeTable

__all__ = ["EXIT"]

EXIT = ExitCodeTable(
    "pypto-capture",
    [
        (
            1,
            "FAILED",
            "bisect could not run the model before any stage (its prefill or cache build "
            "failed); the message names the error",
        ),
        (
            2,
            "USAGE",
            "bad usage: an unknown flag or value, a malformed --device, an empty explain text",
        ),
        (
            3,
            "ENVIRONMENT",
            "transformers is not installed (pip install 'pypto-capture[hf]') or the --device "
            "is not present on this machine",
        ),
        (
            90,
            "STAGE_FAILED",
            "bisect ran: a stage failed to capture; the report names the first one, its cause "
            "and fix",
        ),
        (
            91,
            "MODEL_NOT_FOUND",
            "--model-path is missing, not a folder, or its config.json is absent or unreadable",
        ),
        (
            92,
            "REMOTE_CODE",
            "the folder's model needs the Python files it ships (auto_map); pypto-capture never "
            "runs a folder's code",
        ),
        (93, "LOAD_FAILED", "transformers could not load the model from the folder"),
        (
            94,
            "UNSUPPORTED_MODEL",
            "bisect cannot split the model: no embedding or layer list it can find, or no "
            "layer --layer-index",
        ),
        (
            95,
            "UNRECOGNISED",
            "explain: the code or message is not in the table of known capture failures "
            "(the advice printed is to bisect)",
        ),
    ],
)
