"""pypto-e2e: one command from a model card to a throughput report.

Library first: :func:`run` chains pypto-download, pypto-patch and pypto-bench with a
resumable manifest; :func:`run_demo` runs it offline on the embedded demo model. The
``pypto-e2e`` CLI is a thin layer over both.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .chain import RunResult, run
from .config import STEPS, RunConfig
from .demo import run_demo
from .errors import (
    EXIT,
    BadRunInputError,
    E2EEnvironmentError,
    E2EError,
    StepFailedError,
    WorkDirBusyError,
    WorkDirError,
)
from .fingerprint import FolderFingerprint, fingerprint_folder
from .manifest import MANIFEST_NAME
from .report import render_markdown
from .state import StepOutcome

__all__ = [
    "EXIT",
    "MANIFEST_NAME",
    "STEPS",
    "BadRunInputError",
    "E2EEnvironmentError",
    "E2EError",
    "FolderFingerprint",
    "RunConfig",
    "RunResult",
    "StepFailedError",
    "StepOutcome",
    "WorkDirBusyError",
    "WorkDirError",
    "__version__",
    "fingerprint_folder",
    "render_markdown",
    "run",
    "run_demo",
]
