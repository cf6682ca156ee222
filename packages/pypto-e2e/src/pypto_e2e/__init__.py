"""pypto-e2e: one command from a model card to a throughput report.

Library first: :func:`run` chains pypto-download, pypto-patch and pypto-bench with a
resumable manifest; :func:`run_demo` runs it offline on the embedded demo model. The
``pypto-e2e`` CLI is a thin layer over both.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .demo import run_demo
from .pipeline import (
    MANIFEST_NAME,
    STEPS,
    BadRunInputError,
    E2EError,
    RunConfig,
    RunResult,
    StepFailedError,
    run,
)

__all__ = [
    "MANIFEST_NAME",
    "STEPS",
    "BadRunInputError",
    "E2EError",
    "RunConfig",
    "RunResult",
    "StepFailedError",
    "__version__",
    "run",
    "run_demo",
]
