"""The run manifest (``pypto-e2e.json`` in the work dir): what ran, on what, with what result.

It is what makes a re-run cheap and honest: a step is reused only when it completed
before *and* its inputs (including the outputs of the steps it depends on) fingerprint
the same. Every save goes through :func:`pypto_common.redact_obj` and
:func:`pypto_common.atomic_write_text`: a token that reached an error message never
lands on disk, and a crash mid-write leaves the previous manifest, not half of one.

Reading it back trusts nothing: the file is read by pypto-common's
:func:`~pypto_common.read_regular_file` (a regular file, at most
:data:`MAX_MANIFEST_BYTES` actually read) and :func:`~pypto_common.loads_bounded`
(strict UTF-8, bounded nesting and integer length, finite numbers) and checked once
against the schema below (:func:`validate_manifest`) before any value is used, so a
corrupt or edited manifest is the one line "run manifest ... is unreadable (why):
delete it", never a traceback deep inside a step. Non-finite numbers are saved as
``null`` so that what a run writes, the next one reads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pypto_common import (
    UntrustedFileError,
    atomic_write_text,
    loads_bounded,
    read_regular_file,
    redact_obj,
)

from .config import STEPS
from .errors import BadRunInputError, WorkDirError

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_SCHEMA_VERSION",
    "MAX_MANIFEST_BYTES",
    "Manifest",
    "ManifestSchemaError",
    "changed_inputs",
    "fingerprint",
    "validate_manifest",
]

log = logging.getLogger(__name__)

MANIFEST_NAME = "pypto-e2e.json"
# 2: steps' model inputs fingerprint every file; errors carry exit code names and causes.
MANIFEST_SCHEMA_VERSION = 2

#: Largest manifest read back. Its bulk is one digest record (~150 bytes) per model
#: file, so even a checkpoint of 100000 files stays far below this.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
#: Deepest nesting read back. pypto-patch accepts repo auto_map values nested up to 200
#: levels, and the manifest quotes the removed ones about 8 levels down.
MAX_MANIFEST_DEPTH = 256
#: Longest integer read back (an inode or mtime_ns has about 20 digits).
MAX_INT_DIGITS = 40

#: The statuses a step is recorded with ("reused" is shown, never recorded).
STATUSES = ("ok", "not-needed", "skipped", "running", "failed")


def fingerprint(value: Any) -> str:
    """A short stable digest of a JSON-like value (what step reuse compares)."""
    blob = json.dumps(value, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def changed_inputs(before: Any, now: dict[str, Any], *, most: int = 3) -> str:
    """What differs between a step's recorded and current inputs, for the log line.

    ``its inputs changed: software.torch 2.12.0 -> 2.13.0, gen 64 -> 32``; values are
    shown only when short (a folder summary is named by its key alone).
    """
    old = _flatten(before) if isinstance(before, dict) else {}
    new = _flatten(now)
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k, _ABSENT) != new.get(k, _ABSENT))
    if not keys:
        return "its inputs changed"
    shown = [_change(k, old.get(k, _ABSENT), new.get(k, _ABSENT)) for k in keys[:most]]
    more = f" and {len(keys) - most} more" if len(keys) > most else ""
    return f"its inputs changed: {', '.join(shown)}{more}"


_ABSENT = object()


def _flatten(value: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys to leaves, without recursion (the recorded inputs are read back)."""
    out: dict[str, Any] = {}
    stack: list[tuple[str, Any]] = [(str(k), v) for k, v in value.items()]
    while stack:
        key, v = stack.pop()
        if isinstance(v, dict) and v:
            stack.extend((f"{key}.{k}", x) for k, x in v.items())
        else:
            out[key] = v
    return out


def _change(key: str, old: Any, new: Any) -> str:
    def text(v: Any) -> str:
        if v is _ABSENT:
            return "(none)"
        shown = json.dumps(v, default=str) if not isinstance(v, str) else v
        return shown if len(shown) <= 40 else shown[:37] + "..."

    return f"{key} {text(old)} -> {text(new)}"


class ManifestSchemaError(ValueError):
    """A manifest value has the wrong type or shape; ``str()`` names where and what."""


class Manifest:
    """The run record in the work dir; written atomically after every state change."""

    def __init__(self, path: Path, *, secrets: Iterable[str | None] = ()) -> None:
        self.path = path
        self.secrets = [s for s in secrets if s]
        self.data: dict[str, Any] = {"schema_version": MANIFEST_SCHEMA_VERSION, "steps": {}}
        loaded = self._load()
        if loaded is not None:
            self.data = loaded
        self.data.setdefault("steps", {})
        # The last run's per-file digests (the fingerprint's fast path) are read from
        # here; this run's go into a fresh map, so files that are gone drop out.
        self.previous_digests: dict[str, dict[str, Any]] = self.data.get("file_digests") or {}
        self.file_digests: dict[str, dict[str, Any]] = {}
        self.data["file_digests"] = self.file_digests

    def _load(self) -> dict[str, Any] | None:
        """The validated manifest, None when there is none (or of another schema)."""
        try:
            raw = read_regular_file(self.path, MAX_MANIFEST_BYTES)
            doc = loads_bounded(raw, max_depth=MAX_MANIFEST_DEPTH, max_int_digits=MAX_INT_DIGITS)
            return validate_manifest(doc, where=self.path)
        except FileNotFoundError:
            return None
        except OSError as err:
            reason = f"cannot be read: {err.strerror or err}"
        except (UntrustedFileError, ManifestSchemaError) as err:
            reason = str(err)
        raise BadRunInputError(
            f"run manifest {self.path} is unreadable ({reason}): delete it to start the run afresh"
        )

    def step(self, name: str) -> dict[str, Any]:
        entry: dict[str, Any] = self.data["steps"].get(name, {})
        return entry

    def record(self, name: str, **entry: Any) -> None:
        self.data["steps"][name] = entry
        self.save()

    def save(self) -> None:
        try:
            text = json.dumps(
                _finite(redact_obj(self.data, self.secrets)),
                indent=2,
                sort_keys=True,
                default=str,
                allow_nan=False,
            )
            atomic_write_text(self.path, text + "\n")
        except OSError as err:
            raise WorkDirError(
                f"cannot write the run manifest {self.path}: {err.strerror or err} "
                "(free disk space or make the work dir writable, then re-run)"
            ) from err


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


# --------------------------------------------------------------------------- the schema


def validate_manifest(doc: Any, *, where: Path | str = "") -> dict[str, Any] | None:
    """``doc`` when it is a valid manifest of this schema; None for another schema version.

    Raises :class:`ManifestSchemaError` naming the first wrong value (by its JSON path).
    Keys the code never reads are allowed and kept; every key it reads is checked here,
    once, so no step meets a value of the wrong type.
    """
    _expect(isinstance(doc, dict), "the document", "an object", doc)
    version = doc.get("schema_version")
    _expect(_is_int(version), "schema_version", "an integer", version)
    if version != MANIFEST_SCHEMA_VERSION:
        log.warning(
            "run manifest %s is of schema version %s, not %s: every step runs again",
            where,
            version,
            MANIFEST_SCHEMA_VERSION,
        )
        return None
    steps = doc.get("steps", {})
    _expect(isinstance(steps, dict), "steps", "an object", steps)
    for name, entry in steps.items():
        _expect(name in STEPS, f"steps.{name}", f"one of the steps {', '.join(STEPS)}", name)
        _check_step(f"steps.{name}", entry)
    digests = doc.get("file_digests", {})
    _expect(isinstance(digests, dict), "file_digests", "an object", digests)
    for path, record in digests.items():
        _check_object(f"file_digests[{path!r}]", record, _DIGEST_RECORD, required=True)
    command_line = doc.get("command_line", [])
    _expect(_is_str_list(command_line), "command_line", "a list of strings", command_line)
    result = doc.get("result", {})
    _expect(isinstance(result, dict), "result", "an object", result)
    return doc


def _expect(ok: bool, at: str, wanted: str, value: Any) -> None:
    if not ok:
        raise ManifestSchemaError(f"{at} should be {wanted}, not {_shown(value)}")


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return f"the {type(value).__name__} {str(value)[:40]}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _object_of(spec: dict[str, tuple[str, Callable[[Any], bool]]]) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        return isinstance(v, dict) and all(
            key not in v or ok(v[key]) for key, (_wanted, ok) in spec.items()
        )

    return check


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _dict(v: Any) -> bool:
    return isinstance(v, dict)


#: Each spec maps a key to (what it should be, its check).
Spec = dict[str, tuple[str, Callable[[Any], bool]]]

_DIGEST_RECORD: Spec = {
    "size": ("an integer", _is_int),
    "mtime_ns": ("an integer", _is_int),
    "ino": ("an integer", _is_int),
    "digest": ("a string", _str),
}

_RECOMMENDATION: Spec = {
    "id": ("a string or null", _optional(_str)),
    "title": ("a string or null", _optional(_str)),
    "estimated_speedup": ("a number or null", _optional(_is_number)),
    "command": ("a string or null", _optional(_str)),
}

_REMOVED_ENTRY: Spec = {
    "file": ("a string", _str),
    "at": ("a string", _str),
    "key": ("a string", _str),
}

#: Every output key any step records and a later run reads back.
_OUTPUTS: Spec = {
    "model_path": ("a path string", _str),
    "report_json": ("a path string", _str),
    "report_markdown": ("a path string", _str),
    "report_html": ("a path string", _str),
    "node_figures": ("a path string", _str),
    "plot": ("a path string", _str),
    "dir": ("a path string", _str),
    "report_sha256": ("a string", _str),
    "preset": ("a string", _str),
    "arm": ("a string", _str),
    "level": ("a string", _str),
    "step_unit": ("a string or null", _optional(_str)),
    "not_needed": ("a boolean", _bool),
    "pinned": ("a boolean", _bool),
    "remote_report": ("a boolean", _bool),
    "nnodes": ("an integer", _is_int),
    "node_rank": ("an integer or null", _optional(_is_int)),
    "folder": (
        "an object with string path and digest",
        lambda v: (
            isinstance(v, dict)
            and isinstance(v.get("path"), str)
            and isinstance(v.get("digest"), str)
        ),
    ),
    "files": (
        "an object of path strings",
        lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
    ),
    "history": (
        "an object with a string path and an integer run_id",
        lambda v: (
            isinstance(v, dict) and isinstance(v.get("path"), str) and _is_int(v.get("run_id"))
        ),
    ),
    "auto_map": ("an object", _dict),
    "removed_auto_map": (
        "a list of {file, at, key} objects",
        _list_of(_object_of(_REMOVED_ENTRY)),
    ),
    "remote_code": ("a list of objects", _list_of(_dict)),
    "failed_arms": ("a list of strings", _is_str_list),
    "result": ("an object", _dict),
    "step_us": ("a number or null", _optional(_is_number)),
    "findings": ("an integer", _is_int),
    "recommendations": (
        "a list of {id, title, estimated_speedup, command} objects",
        _list_of(_object_of(_RECOMMENDATION)),
    ),
}

_ERROR: Spec = {
    "message": ("a string", _str),
    "exit_code": ("an integer", _is_int),
    "name": ("a string", _str),
    "step": ("a string or null", _optional(_str)),
    "cause": ("an object or null", _optional(_dict)),
}

_STEP: Spec = {
    "status": (f"one of {', '.join(STATUSES)}", lambda v: v in STATUSES),
    "fingerprint": ("a string or null", _optional(_str)),
    "inputs": ("an object or null", _optional(_dict)),
    "started": ("a number or null", _optional(_is_number)),
    "seconds": ("a number or null", _optional(_is_number)),
    "note": ("a string", _str),
}


def _check_object(at: str, value: Any, spec: Spec, *, required: bool = False) -> None:
    _expect(isinstance(value, dict), at, "an object", value)
    for key, (wanted, ok) in spec.items():
        if key not in value:
            _expect(not required, f"{at}.{key}", wanted, None)
            continue
        _expect(ok(value[key]), f"{at}.{key}", wanted, value[key])


def _check_step(at: str, entry: Any) -> None:
    _check_object(at, entry, _STEP)
    _expect("status" in entry, f"{at}.status", _STEP["status"][0], None)
    outputs = entry.get("outputs", {})
    _check_object(f"{at}.outputs", outputs, _OUTPUTS)
    if "error" in entry:
        _check_object(f"{at}.error", entry["error"], _ERROR)
