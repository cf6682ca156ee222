"""The software that produced a step's results, as part of the step's inputs.

Why: a re-run reused smoke and bench results after torch, transformers or a pypto
package was upgraded, so a report could show numbers that the installed stack never
measured. Every step but the download (whose bytes are checked against the hub's
digests whatever the tools' versions) now records these versions among its inputs, and
a changed version re-runs it, saying which.
"""

from __future__ import annotations

import platform
import re
from importlib import metadata

__all__ = ["TRACKED", "software_versions"]

#: Distributions tracked by name besides every ``pypto`` / ``pypto-*`` one.
TRACKED = ("torch", "transformers", "torch-npu")


def _normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Pypto_Bench`` is ``pypto-bench``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _tracked(name: str) -> bool:
    return name in TRACKED or name == "pypto" or name.startswith("pypto-")


def software_versions() -> dict[str, str]:
    """``{"python": ..., "torch": ..., "transformers": ..., "pypto-bench": ..., ...}``.

    Every installed distribution named ``pypto`` or ``pypto-*`` (the PyPTO compiler and
    each pypto tool, kernel and model package) and torch, transformers and torch-npu
    when installed, plus the Python version; sorted, so the fingerprint is stable.
    """
    found: dict[str, str] = {"python": platform.python_version()}
    for dist in metadata.distributions():
        raw = dist.metadata["Name"] if dist.metadata else None
        if not raw:
            continue
        name = _normalise(str(raw))
        if _tracked(name) and name not in found:
            found[name] = str(dist.version)
    return dict(sorted(found.items()))
