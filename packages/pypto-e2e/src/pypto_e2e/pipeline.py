"""Deprecated: the e2e step chain is :mod:`pypto_e2e.chain` (and :mod:`pypto_e2e.state`).

"pipeline" in this project means pipeline placement (pypto-bench ``--placement
pipeline``); the download -> patch -> smoke -> precision -> bench -> tune -> report chain moved to
:mod:`pypto_e2e.chain` (issue 28). This module only re-exports its names, so
``from pypto_e2e.pipeline import run`` keeps working; import from
:mod:`pypto_e2e` (or :mod:`pypto_e2e.chain`) instead. It will be removed in a later
minor release.
"""

from __future__ import annotations

import warnings

from .chain import MANIFEST_NAME, STEPS, RunResult, run
from .state import RunState, StepOutcome

__all__ = ["MANIFEST_NAME", "STEPS", "RunResult", "RunState", "StepOutcome", "run"]

warnings.warn(
    "pypto_e2e.pipeline is deprecated: import from pypto_e2e.chain (run, RunResult) and "
    "pypto_e2e.state (RunState, StepOutcome), or from pypto_e2e itself",
    DeprecationWarning,
    stacklevel=2,
)
