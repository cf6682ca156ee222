"""pypto-e2e's exit codes and typed errors.

Why its own codes: e2e chains three tools whose codes overlap in meaning but not in
number; passing a step's code through made e2e exit 10 for a malformed model id while
its README called 10 "load failed". Each step's failure now maps to one e2e code, and
the step tool's own code and name travel along as ``cause`` (in ``--json`` errors and
the run manifest) for whoever needs the detail.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from pypto_common import ENVIRONMENT, USAGE, ExitCodeTable, redact

__all__ = [
    "EXIT",
    "STEP_CODES",
    "STEP_TOOLS",
    "BadRunInputError",
    "E2EEnvironmentError",
    "E2EError",
    "StepFailedError",
    "WorkDirBusyError",
    "WorkDirError",
    "cause_of",
    "e2e_code_for",
    "step_failure",
]

#: pypto-e2e's exit codes (shared 0-3 plus its own range 60-69); read them by name.
EXIT = ExitCodeTable(
    "pypto-e2e",
    [
        (0, "OK", "success: every step that ran completed and every bench arm ran"),
        (1, "FAILED", "the run failed for a reason not listed below (details on stderr)"),
        (
            2,
            "USAGE",
            "bad flags or input (also a step's own bad-input failure, e.g. an unknown family)",
        ),
        (
            3,
            "ENVIRONMENT",
            "something the run needs is missing here (a device; for the demo, pypto-e2e[demo])",
        ),
        (60, "DOWNLOAD_FAILED", "the download step failed; cause names pypto-download's code"),
        (61, "PATCH_FAILED", "the patch step (or its verification of the pin) failed"),
        (
            62,
            "REMOTE_CODE_REFUSED",
            "the model ships its own code and nothing pins it: pass --family, --auto-map/--copy "
            "or --trust-remote-code",
        ),
        (63, "SMOKE_FAILED", "the smoke gate stopped the run (load, generation or output check)"),
        (
            64,
            "BENCH_FAILED",
            "the bench step failed before measuring (e.g. the model did not load)",
        ),
        (
            65,
            "ARM_FAILED",
            "the bench ran but at least one arm failed, or failed the numerical gate (it "
            "computes something else than eager; --allow-inaccurate lets it pass, marked); "
            "or the precision step found the eager model's logits diverge from the CPU "
            "reference (report/precision/check.md names the module); the report says why",
        ),
        (66, "REPORT_FAILED", "the report could not be written or rendered"),
        (
            67,
            "TUNE_FAILED",
            "the tune step (--tune: profile + advise) failed; the bench results are intact",
        ),
        (
            68,
            "WORK_DIR_UNUSABLE",
            "the work dir cannot be created or written (read-only, a file in the way, disk "
            "full): make it writable or pass another --work-dir",
        ),
        (
            69,
            "WORK_DIR_BUSY",
            "another pypto-e2e run (its pid is named) is using the work dir: wait for it or "
            "stop it, or pass another --work-dir",
        ),
    ],
)

#: Which tool each step calls, for the ``cause`` of a failure.
STEP_TOOLS = {
    "download": ("pypto-download", "pypto_download"),
    "patch": ("pypto-patch", "pypto_patch"),
    "smoke": ("pypto-bench", "pypto_bench"),
    "precision": ("pypto-precision", "pypto_precision"),
    "bench": ("pypto-bench", "pypto_bench"),
    "tune": ("pypto-tune", "pypto_tune"),
    "report": ("pypto-bench", "pypto_bench"),
}

#: The e2e code a step's failure maps to when the step tool did not report bad input.
STEP_CODES = {
    "download": EXIT.DOWNLOAD_FAILED,
    "patch": EXIT.PATCH_FAILED,
    "smoke": EXIT.SMOKE_FAILED,
    "precision": EXIT.BENCH_FAILED,
    "bench": EXIT.BENCH_FAILED,
    "tune": EXIT.TUNE_FAILED,
    "report": EXIT.REPORT_FAILED,
}


def cause_of(tool: str, module: str, code: int | None) -> dict[str, Any] | None:
    """``{"tool", "code", "name"}`` for a step tool's exit code, named by its own table."""
    if not isinstance(code, int):
        return None
    name = None
    try:
        table = getattr(importlib.import_module(module), "EXIT", None)
    except ImportError:
        table = None
    if table is not None:
        name = table.name_of(code)
    return {"tool": tool, "code": code, "name": name}


def e2e_code_for(step: str, tool_code: int | None) -> int:
    """The e2e exit code for ``step`` failing with the step tool's ``tool_code``.

    Bad input and a missing environment keep their shared meaning whichever tool saw
    them; anything else is "this step failed".
    """
    if tool_code == USAGE:
        return EXIT.USAGE
    if tool_code == ENVIRONMENT:
        return EXIT.ENVIRONMENT
    return STEP_CODES.get(step, EXIT.FAILED)


class E2EError(Exception):
    """Base error; ``str()`` is one line, ``exit_code`` what the CLI exits with.

    ``cause`` names the step tool's own code when a step failed (``None`` otherwise).
    """

    exit_code = EXIT.FAILED
    step: str | None = None
    cause: dict[str, Any] | None = None

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))

    def to_dict(self, secrets: Iterable[str | None] = ()) -> dict[str, Any]:
        """The error as the ``--json`` output and the manifest record it (redacted)."""
        return {
            "message": redact(str(self), secrets),
            "exit_code": self.exit_code,
            "name": EXIT.name_of(self.exit_code),
            "step": self.step,
            "cause": self.cause,
        }


class BadRunInputError(E2EError):
    """The request is inconsistent before any step runs; nothing was written."""

    exit_code = EXIT.USAGE

    def __init__(self, message: str, *, cause: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class E2EEnvironmentError(E2EError):
    """Something the run needs is not installed or not available here."""

    exit_code = EXIT.ENVIRONMENT


class StepFailedError(E2EError):
    """A step failed; names it and how to resume. Earlier steps stay completed."""

    def __init__(
        self,
        step: str,
        message: str,
        *,
        exit_code: int | None = None,
        resume: str = "",
        cause: dict[str, Any] | None = None,
    ) -> None:
        self.step = step
        self.exit_code = STEP_CODES.get(step, EXIT.FAILED) if exit_code is None else exit_code
        self.cause = cause
        hint = resume or "fix the cause and re-run the same command: completed steps are reused"
        super().__init__(f"step {step!r} failed: {message} ({hint})")


def step_failure(step: str, err: BaseException, *, resume: str = "") -> StepFailedError:
    """A step tool's typed error as the e2e failure of ``step`` (its code kept as cause)."""
    tool, module = STEP_TOOLS[step]
    code = getattr(err, "exit_code", None)
    code = code if isinstance(code, int) else None
    message = " ".join(str(err).split()) or type(err).__name__
    return StepFailedError(
        step,
        message,
        exit_code=e2e_code_for(step, code),
        resume=resume,
        cause=cause_of(tool, module, code),
    )


class WorkDirError(E2EError):
    """The work dir cannot be created or written; names the path and the fix."""

    exit_code = EXIT.WORK_DIR_UNUSABLE


class WorkDirBusyError(E2EError):
    """Another live run holds the work dir's lock; names it (its pid) and the fix."""

    exit_code = EXIT.WORK_DIR_BUSY
