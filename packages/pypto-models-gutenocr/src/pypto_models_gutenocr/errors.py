"""Exit codes and typed errors of ``pypto-gutenocr``.

Errors carry the exit code they map to, so the CLI prints ``str(err)`` as one line and
exits with ``err.exit_code``; callers compare codes by name (``EXIT.KERNEL_FAILED``),
never by number, because the numbers come from the project's per-tool ranges.
"""

from __future__ import annotations

from pypto_common import ExitCodeTable

__all__ = ["EXIT", "AskError", "BadInputError", "EnvironmentMissingError", "ModelLoadError"]

#: pypto-gutenocr's exit codes (shared 0-3 plus its own range 70-79).
EXIT = ExitCodeTable(
    "pypto-gutenocr",
    [
        (1, "FAILED", "the run failed (details on stderr)"),
        (
            2,
            "USAGE",
            "bad flags or input (model folder, image, device spec, policy file, mrope_section)",
        ),
        (3, "ENVIRONMENT", "the requested device or an optional dependency is missing"),
        (
            70,
            "KERNEL_FAILED",
            "a PyPTO kernel failed inside its envelope (rerun with the switch off to compare)",
        ),
        (71, "LOAD_FAILED", "the model folder did not load (broken or not a GutenOCR checkpoint)"),
    ],
)


class AskError(Exception):
    """Base of the runner's errors; ``str()`` is one line naming the problem and the fix."""

    exit_code = EXIT.FAILED


class BadInputError(AskError):
    exit_code = EXIT.USAGE


class EnvironmentMissingError(AskError):
    exit_code = EXIT.ENVIRONMENT


class ModelLoadError(AskError):
    exit_code = EXIT.LOAD_FAILED
