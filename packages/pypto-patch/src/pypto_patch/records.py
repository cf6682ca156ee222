"""pypto-patch's own records in a folder: the manifest and the journal, read and written.

* the manifest (``.pypto_patch.json``) is the commit point of an apply and says what the
  folder holds; the journal (``.pypto_patch.journal.json``) lists the changes of a run in
  flight, so a crash can be rolled back (or forward);
* reading either proves it is ours first (bound to this very folder, paths inside it:
  :mod:`pypto_patch.bookkeeping`), so a record shipped by a repo never steers a rename;
* :func:`status_from_manifest` compares the folder with what its manifest recorded
  (the sha256 signatures of every placed file and backup).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import __version__ as TOOL_VERSION
from .bookkeeping import TOOL, check_journal, check_manifest, folder_identity, read_record
from .fsops import atomic_write, new_file_mode, sha_or_none
from .names import JOURNAL_NAME, MANIFEST_NAME
from .plan import Plan
from .results import StatusResult

__all__ = [
    "MANIFEST_SCHEMA_VERSION",
    "journal_doc",
    "load_journal",
    "load_manifest",
    "manifest_doc",
    "read_manifest",
    "record_signature",
    "status_from_manifest",
    "write_record",
]

#: 2: records are bound to their folder ("folder"), auto_map files other than
#: config.json are pinned too, "removed" file actions, "removed_auto_map".
MANIFEST_SCHEMA_VERSION = 2


def load_manifest(root: Path) -> dict[str, Any] | None:
    """The folder's manifest, proven to be ours and bound to ``root``; None if absent."""
    record = root / MANIFEST_NAME
    doc = read_record(record)
    if doc is not None:
        check_manifest(root, doc, record)
    return doc


def load_journal(root: Path) -> dict[str, Any] | None:
    """The folder's journal, proven to be ours and bound to ``root``; None if absent."""
    record = root / JOURNAL_NAME
    doc = read_record(record)
    if doc is not None:
        check_journal(root, doc, record)
    return doc


def read_manifest(model_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest of a patched folder, or None.

    Raises :class:`UnsafeBookkeepingError` when the folder holds a manifest that was not
    written by pypto-patch for this very folder (shipped by a repo, or copied along).
    """
    return load_manifest(Path(model_path).expanduser().resolve())


def write_record(path: Path, doc: Mapping[str, Any]) -> None:
    """Write a record (manifest, journal, marker) atomically, as sorted, indented JSON."""
    atomic_write(
        path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8"), new_file_mode()
    )


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def manifest_doc(
    plan: Plan,
    txn: str,
    *,
    mode: str,
    source: Path,
    purged: list[str],
    folder: Mapping[str, Any],
) -> dict[str, Any]:
    """The manifest of ``plan`` carried out as transaction ``txn`` (schema above)."""
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "tool": TOOL,
        "tool_version": TOOL_VERSION,
        "created_at": _now(),
        "transaction": txn,
        "folder": dict(folder),
        "mode": mode,
        "source_path": str(source),
        "preset": plan.preset.to_summary(),
        "fingerprint": plan.preset.fingerprint,
        "auto_map_before": plan.config.get("auto_map"),
        "removed_auto_map": plan.removed_auto_map,
        "files": [asdict(c) for c in plan.changes],
        "created_dirs": plan.created_dirs,
        "cache_purged": purged,
    }


def journal_doc(
    root: Path, op: str, txn: str, files: list[dict[str, Any]], dirs: list[str]
) -> dict[str, Any]:
    """The journal of an ``op`` (apply | restore) about to change ``files`` in ``root``."""
    return {
        "tool": TOOL,
        "op": op,
        "transaction": txn,
        "folder": folder_identity(root),
        "files": files,
        "created_dirs": dirs,
    }


def record_signature(files: list[Mapping[str, Any]]) -> set[tuple[str, str, str | None]]:
    """A manifest's ``files`` as (path, action, sha256), comparable with :meth:`Plan.signature`."""
    return {(f["path"], f["action"], f.get("patched_sha256")) for f in files}


def status_from_manifest(root: Path, manifest: Mapping[str, Any]) -> StatusResult:
    """What the folder holds against what its manifest recorded (placed files, backups,
    and for an overlay the source files it replaced)."""
    preset = manifest.get("preset", {})
    st = StatusResult(
        model_path=str(root),
        patched=True,
        mode=manifest.get("mode"),
        family=preset.get("family"),
        preset_version=preset.get("version"),
        distribution=preset.get("distribution"),
        tool_version=manifest.get("tool_version"),
        created_at=manifest.get("created_at"),
        source_path=manifest.get("source_path"),
        files=list(manifest.get("files", [])),
        removed_auto_map=list(manifest.get("removed_auto_map", [])),
    )
    for f in manifest.get("files", []):
        if f["action"] != "unchanged":
            _compare_entry(root, manifest, f, st)
    return st


def _compare_entry(
    root: Path, manifest: Mapping[str, Any], f: Mapping[str, Any], st: StatusResult
) -> None:
    path = root / f["path"]
    if f["action"] == "removed":
        if os.path.lexists(path):
            st.changed_since.append(f["path"])
    elif path.is_symlink() or sha_or_none(path) != f["patched_sha256"]:
        st.changed_since.append(f["path"])
    if f.get("backup"):
        b = root / f["backup"]
        if not os.path.lexists(b) or sha_or_none(b) != f.get("original_sha256"):
            st.backups_damaged.append(f["backup"])
    if st.mode == "overlay" and f["action"] in ("replaced", "removed"):
        src = Path(manifest.get("source_path", "")) / f["path"]
        if sha_or_none(src) != f.get("original_sha256"):
            st.source_changed.append(f["path"])
