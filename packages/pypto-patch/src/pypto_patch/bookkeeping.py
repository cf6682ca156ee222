"""Bookkeeping found in a folder is untrusted until proven to be ours, for this folder.

A model folder is filled from a stranger's repo, and pypto-download copies dotfiles: a
repo can ship a ``.pypto_patch.journal.json`` whose "rollback" renames files over
``/home/user/.bashrc``, or a manifest whose "restore" moves them out of the folder. So
every manifest, journal and overlay marker pypto-patch reads is checked here, before
any of it steers a rename or an unlink:

* it is bound to the folder it was written for (:func:`folder_identity`), so a record
  shipped by a repo, or copied along with a folder from elsewhere, is refused;
* every path in it is a plain relative path that stays inside the folder without
  passing through a symbolic link, and backups / set-aside names are exactly the ones
  pypto-patch derives from those paths.

Anything else raises :class:`UnsafeBookkeepingError` (one line) with nothing touched.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from pypto_common import tool_owned_reason

from .errors import UnsafeBookkeepingError
from .jsonio import RECORD_MAX_DEPTH, JSONUnusable, loads_limited
from .names import BACKUP_SUFFIX, EDITED_SUFFIX

__all__ = [
    "TOOL",
    "check_bound",
    "check_inside",
    "check_journal",
    "check_manifest",
    "check_marker",
    "folder_identity",
    "plain_relpath",
    "read_record",
]

TOOL = "pypto-patch"
_TXN_RE = re.compile(r"^[0-9a-f]{32}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_ACTIONS = frozenset({"replaced", "created", "unchanged", "removed"})
# The most a record may hold: real presets place a handful of files.
_MAX_ENTRIES = 10_000


def folder_identity(folder: Path, *, as_path: Path | None = None) -> dict[str, Any]:
    """What binds a record to ``folder``: its resolved path and its inode.

    Why these two: a re-run (same folder, any later process, after a reboot) sees the
    same resolved path and inode, so it is accepted. A record shipped inside a repo
    cannot know the inode the user's filesystem will give the folder, and a copy of a
    patched folder (``cp -a``, rsync, a tarball) gets a new inode and usually a new
    path, so both are refused. ``st_dev`` is recorded for diagnostics but not compared:
    overlayfs (containers), NFS and tmpfs hand out device numbers per mount, which
    change across remounts and restarts, and would break ordinary re-runs. A folder
    moved with ``mv`` keeps its inode but not its path, and is refused too: move it
    back to finish a restore. ``as_path`` names the path the folder will have (an
    overlay is built under a temporary name and renamed; a rename keeps the inode).
    """
    st = os.stat(folder)
    path = as_path if as_path is not None else Path(os.path.realpath(folder))
    return {"path": str(path), "dev": st.st_dev, "ino": st.st_ino}


def _shown(value: Any) -> str:
    """An untrusted value as a short, single-line, escape-free string for an error."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def check_bound(
    folder: Path, doc: Mapping[str, Any], record: Path, *, expect_path: Path | None = None
) -> None:
    """Raise unless ``doc`` (read from ``record``) was written for ``folder`` itself."""
    ident = doc.get("folder")
    if not isinstance(ident, Mapping):
        raise UnsafeBookkeepingError(
            f"{record} carries no folder binding, so this pypto-patch did not write it for this "
            f"folder (a repo may have shipped it, or an older pypto-patch wrote it: restore with "
            f"that version); nothing was touched: otherwise move it out of the folder"
        )
    current = folder_identity(folder, as_path=expect_path)
    if ident.get("path") != current["path"] or ident.get("ino") != current["ino"]:
        raise UnsafeBookkeepingError(
            f"{record} was written for another folder (path {_shown(ident.get('path'))}, inode "
            f"{_shown(ident.get('ino'))}; this is {current['path']}, inode {current['ino']}): it "
            f"was copied or shipped here, so nothing was touched; if you moved this folder, move "
            f"it back to restore it, otherwise move the record away (backups <name>{BACKUP_SUFFIX} "
            f"hold original bytes)"
        )


def read_record(path: Path) -> dict[str, Any] | None:
    """A bookkeeping file as a dict, None if absent; unreadable or odd ones raise (one line)."""
    try:
        if not path.is_file() or path.is_symlink():
            if os.path.lexists(path):
                raise UnsafeBookkeepingError(
                    f"{path} is not a plain file, so pypto-patch did not write it; nothing was "
                    f"touched: move it out of the folder"
                )
            return None
        raw = path.read_bytes()
    except OSError as err:
        raise UnsafeBookkeepingError(
            f"{path} is unreadable ({err.strerror or err}); move it out of the folder and retry"
        ) from None
    try:
        data = loads_limited(raw, max_depth=RECORD_MAX_DEPTH)
    except JSONUnusable as err:
        raise UnsafeBookkeepingError(
            f"{path} is {err}; pypto-patch did not write it: move it out of the folder and retry"
        ) from None
    if not isinstance(data, dict):
        raise UnsafeBookkeepingError(
            f"{path} is not a pypto-patch record; move it out of the folder and retry"
        )
    return data


def plain_relpath(rel: Any) -> bool:
    """True for a clean relative POSIX path: no ``..``/``.``, absolute part, backslash or NUL."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        return False
    if rel.startswith("/") or re.match(r"^[A-Za-z]:", rel):
        return False
    parts = rel.split("/")
    return all(p not in ("", ".", "..") for p in parts) and PurePosixPath(rel).as_posix() == rel


def check_inside(root: Path, rel: Any, record: Path, what: str) -> str:
    """``rel`` if it names a place inside ``root`` reached without any symbolic link.

    The last component may itself be a link (a hub-cache file is one): pypto-patch only
    renames or unlinks it, never writes through it. Every folder above it must be a real
    folder inside ``root``, or a rename "inside" would land outside.
    """
    if not plain_relpath(rel):
        raise UnsafeBookkeepingError(
            f"{record} lists {what} {_shown(rel)}, which is not a plain path inside the folder; "
            f"nothing was touched: move {record.name} out of the folder"
        )
    cur = root
    for part in str(rel).split("/")[:-1]:
        cur = cur / part
        if cur.is_symlink():
            raise UnsafeBookkeepingError(
                f"{record} lists {what} {_shown(rel)} below the symbolic link {cur}, which may "
                f"lead outside the folder; nothing was touched: move {record.name} out of the folder"
            )
    return str(rel)


def _fail(record: Path, problem: str) -> UnsafeBookkeepingError:
    return UnsafeBookkeepingError(
        f"{record} {problem}; pypto-patch did not write it this way, so nothing was touched: "
        f"move it out of the folder and check the folder by hand"
    )


def _check_sha(record: Path, value: Any, what: str, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not _SHA_RE.match(value):
        raise _fail(record, f"has {what} {_shown(value)}, not a sha256")


def _check_dirs(root: Path, record: Path, doc: Mapping[str, Any], key: str) -> None:
    dirs = doc.get(key, [])
    if not isinstance(dirs, list) or len(dirs) > _MAX_ENTRIES:
        raise _fail(record, f"has a malformed {key!r}")
    for d in dirs:
        check_inside(root, d, record, "folder")
        if tool_owned_reason(d) is not None:
            raise _fail(record, f"lists folder {_shown(d)}, a name pypto-patch owns")


def _check_files(root: Path, record: Path, doc: Mapping[str, Any], *, journal: bool) -> None:
    files = doc.get("files")
    if not isinstance(files, list) or len(files) > _MAX_ENTRIES:
        raise _fail(record, "has no list of files")
    seen: set[str] = set()
    for f in files:
        if not isinstance(f, Mapping):
            raise _fail(record, "has a file entry that is not an object")
        action = f.get("action")
        if action == "unchanged":
            # Never renamed or unlinked, only read (in an overlay it may sit below a link).
            if not plain_relpath(f.get("path")):
                check_inside(root, f.get("path"), record, "file")
            rel = str(f.get("path"))
        else:
            rel = check_inside(root, f.get("path"), record, "file")
        if tool_owned_reason(rel) is not None:
            raise _fail(record, f"lists {_shown(rel)}, a name pypto-patch owns")
        if rel in seen:
            raise _fail(record, f"lists {_shown(rel)} twice")
        seen.add(rel)
        if action not in _ACTIONS:
            raise _fail(record, f"gives {_shown(rel)} the unknown action {_shown(action)}")
        _check_sha(record, f.get("patched_sha256"), "a patched hash", optional=action == "removed")
        _check_sha(record, f.get("original_sha256"), "an original hash", optional=True)
        if not isinstance(f.get("original_is_symlink", False), bool):
            raise _fail(record, f"gives {_shown(rel)} a non-boolean 'original_is_symlink'")
        mode = f.get("mode", 0o644)
        if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
            raise _fail(record, f"gives {_shown(rel)} the file mode {_shown(mode)}")
        backup = f.get("backup")
        if backup is not None and backup != rel + BACKUP_SUFFIX:
            raise _fail(record, f"names backup {_shown(backup)} for {_shown(rel)}")
        aside = f.get("aside")
        aside_ok = aside is None or (
            journal
            and (
                aside == rel + EDITED_SUFFIX
                or re.fullmatch(re.escape(rel + EDITED_SUFFIX) + r"\.[0-9]{1,6}", str(aside))
            )
        )
        if not aside_ok:
            raise _fail(record, f"names a set-aside file {_shown(aside)} for {_shown(rel)}")


def check_manifest(root: Path, doc: Mapping[str, Any], record: Path) -> None:
    """Raise unless ``doc`` is a manifest pypto-patch wrote for ``root``."""
    if doc.get("tool") != TOOL:
        raise _fail(record, "does not say it was written by pypto-patch")
    check_bound(root, doc, record)
    if not isinstance(doc.get("transaction"), str) or not _TXN_RE.match(doc["transaction"]):
        raise _fail(record, "has no transaction id")
    if doc.get("mode") not in ("in-place", "overlay"):
        raise _fail(record, f"has the unknown mode {_shown(doc.get('mode'))}")
    if not isinstance(doc.get("source_path"), str) or not os.path.isabs(doc["source_path"]):
        raise _fail(record, "has no absolute source_path")
    preset = doc.get("preset")
    if (
        not isinstance(preset, Mapping)
        or not isinstance(preset.get("family"), str)
        or not isinstance(preset.get("version"), str)
        or not isinstance(preset.get("auto_map"), Mapping)
        or not isinstance(preset.get("files"), list)
    ):
        raise _fail(record, "has a malformed 'preset'")
    _check_files(root, record, doc, journal=False)
    for entry in doc.get("files", []):
        if doc["mode"] == "overlay" and entry.get("backup") is not None:
            raise _fail(record, "is an overlay manifest with backups")
        needs_backup = doc["mode"] == "in-place" and entry["action"] in ("replaced", "removed")
        if needs_backup and entry.get("backup") is None:
            raise _fail(record, f"has no backup for {_shown(entry['path'])}")
    _check_dirs(root, record, doc, "created_dirs")
    _check_dirs(root, record, doc, "materialized_dirs")


def check_journal(root: Path, doc: Mapping[str, Any], record: Path) -> None:
    """Raise unless ``doc`` is a journal pypto-patch wrote for ``root``."""
    if doc.get("tool") != TOOL:
        raise _fail(record, "does not say it was written by pypto-patch")
    if doc.get("op") not in ("apply", "restore"):
        raise _fail(record, f"has the unknown op {_shown(doc.get('op'))}")
    check_bound(root, doc, record)
    if not isinstance(doc.get("transaction"), str) or not _TXN_RE.match(doc["transaction"]):
        raise _fail(record, "has no transaction id")
    _check_files(root, record, doc, journal=True)
    for entry in doc.get("files", []):
        if entry["action"] in ("replaced", "removed") and entry.get("backup") is None:
            raise _fail(record, f"has no backup for {_shown(entry['path'])}")
    _check_dirs(root, record, doc, "created_dirs")


def check_marker(folder: Path, doc: Mapping[str, Any], record: Path, *, expect_path: Path) -> None:
    """Raise unless ``doc`` is the overlay marker pypto-patch wrote into ``folder``.

    ``expect_path`` is where the overlay lives (the marker of a folder still being
    built, or moved aside during a replacement, names the final place).
    """
    if doc.get("tool") != TOOL or doc.get("kind") != "overlay":
        raise _fail(record, "is not a pypto-patch overlay marker")
    check_bound(folder, doc, record, expect_path=expect_path)
    if not isinstance(doc.get("transaction"), str) or not _TXN_RE.match(doc["transaction"]):
        raise _fail(record, "has no transaction id")
