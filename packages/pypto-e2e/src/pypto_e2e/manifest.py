"""The run manifest (``pypto-e2e.json`` in the work dir): what ran, on what, with what result.

It is what makes a re-run cheap and honest: a step is reused only when it completed
before *and* its inputs (including the outputs of the steps it depends on) fingerprint
the same. Every save goes through :func:`pypto_common.redact_obj` and
:func:`pypto_common.atomic_write_text`: a token that reached an error message never
lands on disk, and a crash mid-write leaves the previous manifest, not half of one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pypto_common import atomic_write_text, redact_obj

from .errors import BadRunInputError, E2EError

log = logging.getLogger(__name__)

MANIFEST_NAME = "pypto-e2e.json"
# 2: steps' model inputs fingerprint every file; errors carry exit code names and causes.
MANIFEST_SCHEMA_VERSION = 2


def fingerprint(value: Any) -> str:
    """A short stable digest of a JSON-like value (what step reuse compares)."""
    blob = json.dumps(value, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class Manifest:
    """The run record in the work dir; written atomically after every state change."""

    def __init__(self, path: Path, *, secrets: Iterable[str | None] = ()) -> None:
        self.path = path
        self.secrets = [s for s in secrets if s]
        self.data: dict[str, Any] = {"schema_version": MANIFEST_SCHEMA_VERSION, "steps": {}}
        if path.exists():
            try:
                loaded = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as err:
                raise BadRunInputError(
                    f"run manifest {path} is unreadable ({err}): delete it to start the run afresh"
                ) from err
            if isinstance(loaded, dict) and loaded.get("schema_version") == MANIFEST_SCHEMA_VERSION:
                self.data = loaded
            else:
                log.warning(
                    "run manifest %s is of another schema version: every step runs again", path
                )
        self.data.setdefault("steps", {})
        # The last run's per-file digests (the fingerprint's fast path) are read from
        # here; this run's go into a fresh map, so files that are gone drop out.
        cache = self.data.get("file_digests")
        self.previous_digests: dict[str, dict[str, Any]] = cache if isinstance(cache, dict) else {}
        self.file_digests: dict[str, dict[str, Any]] = {}
        self.data["file_digests"] = self.file_digests

    def step(self, name: str) -> dict[str, Any]:
        entry = self.data["steps"].get(name, {})
        return entry if isinstance(entry, dict) else {}

    def record(self, name: str, **entry: Any) -> None:
        self.data["steps"][name] = entry
        self.save()

    def save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps(
                redact_obj(self.data, self.secrets), indent=2, sort_keys=True, default=str
            )
            atomic_write_text(self.path, text + "\n")
        except OSError as err:
            raise E2EError(
                f"cannot write the run manifest {self.path}: {err.strerror or err} "
                "(free disk space or make the work dir writable, then re-run)"
            ) from err
