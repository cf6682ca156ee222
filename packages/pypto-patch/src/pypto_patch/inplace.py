"""In-place mode: pin the model folder itself, undoably, and restore it.

The folder a user patches may be tens of GB they cannot download again, so every step
is built to be undone:

* nothing is written until the whole plan is validated (bad input changes nothing);
* a journal listing every intended change is written first; backups are hard links
  (the same inode, so a restore by rename is bit-exact, permissions included);
* each file is replaced atomically (temp file + rename), config.json last, so a
  loader never sees auto_map pointing at a module that is not there yet;
* the manifest write is the commit point; an error before it rolls back in process,
  and a crash before it is rolled back by the next apply/restore (which finish an
  interrupted restore instead): :func:`recover`;
* an flock on the folder keeps two runs from interleaving.

The crash points (:data:`pypto_patch.fsops.FAULT_POINTS`, ``apply:*`` and ``restore:*``)
are named where each transaction step completes; the crash tests rely on them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import modcache
from .bookkeeping import folder_identity
from .errors import (
    BadInputError,
    ModifiedSincePatchError,
    NotPatchedError,
    PatchError,
    PatchFailedError,
)
from .fsops import (
    aside_name,
    atomic_write,
    dir_lock,
    fault_point,
    fsync_dir,
    make_backup,
    put_back,
    sha_or_none,
    tmp_path_for,
)
from .modelfolder import read_config, require_writable
from .names import JOURNAL_NAME, MANIFEST_NAME
from .plan import Plan, make_plan
from .presets import Preset
from .records import (
    journal_doc,
    load_journal,
    load_manifest,
    manifest_doc,
    status_from_manifest,
    write_record,
)
from .results import FileChange, PatchResult, RestoreResult

log = logging.getLogger(__name__)

__all__ = [
    "apply_in_place",
    "execute_apply",
    "recover",
    "restore_folder",
    "restore_in_place",
    "rollback_apply",
    "run_restore",
]


# --------------------------------------------------------------------------- apply


def apply_in_place(
    root: Path,
    preset: Preset,
    *,
    model_path: str | os.PathLike[str],
    force: bool,
    dry_run: bool,
    lock_timeout: float,
) -> PatchResult:
    """Pin ``root`` itself to ``preset`` (re-pinning or leaving an existing pin as needed)."""
    shown = os.path.abspath(os.path.expanduser(os.fspath(model_path)))
    read_config(root)  # bad input must surface before anything else, lock included
    if dry_run:
        return _dry_run(root, preset, shown)
    require_writable(
        root, hint="make it writable (chmod u+w) or build an overlay elsewhere with --output-dir"
    )
    with dir_lock(root, timeout=lock_timeout):
        # Both records are checked before recover acts on either.
        load_journal(root)
        load_manifest(root)
        recovered = recover(root)
        manifest = load_manifest(root)
        restored_first = False
        if manifest is not None:
            same = _unchanged_result(root, preset, manifest, shown)
            if same is not None:
                same.recovered = recovered
                return same
            log.debug(
                "%s is patched with %s: restoring it first", root, manifest["preset"]["family"]
            )
            restore_in_place(root, manifest, force=force)
            restored_first = True
        plan = make_plan(root, preset, in_place=True)
        for c in plan.changes:
            parent = (root / c.path).parent
            require_writable(parent if parent.exists() else root, hint="make it writable")
        old_keys = modcache.folder_cache_keys(root, model_path)
        execute_apply(plan)
        purged = modcache.purge([old_keys])
        if purged:
            m = load_manifest(root) or {}
            m["cache_purged"] = purged
            write_record(root / MANIFEST_NAME, m)
    res = PatchResult(shown, str(root), "in-place", "applied", preset.family, preset.version)
    res.changes, res.created_dirs = plan.changes, plan.created_dirs
    res.restored_first, res.recovered, res.cache_purged = restored_first, recovered, purged
    res.auto_map = dict(preset.auto_map)
    res.removed_auto_map = plan.removed_auto_map
    return res


def _dry_run(root: Path, preset: Preset, shown: str) -> PatchResult:
    """What apply would do; reads only (forged records are still refused)."""
    load_journal(root)
    manifest = load_manifest(root)
    plan = make_plan(root, preset, in_place=True) if manifest is None else None
    res = PatchResult(shown, str(root), "in-place", "dry-run", preset.family, preset.version)
    res.auto_map = dict(preset.auto_map)
    res.restored_first = manifest is not None and manifest.get("fingerprint") != preset.fingerprint
    if manifest is not None and not res.restored_first:
        res.action = "dry-run:unchanged"
        res.removed_auto_map = list(manifest.get("removed_auto_map", []))
    if plan is not None:
        res.changes, res.created_dirs = plan.changes, plan.created_dirs
        res.removed_auto_map = plan.removed_auto_map
    return res


def _unchanged_result(
    root: Path, preset: Preset, manifest: Mapping[str, Any], shown: str
) -> PatchResult | None:
    """The result when ``root`` is already pinned to exactly ``preset``; None when it must
    be restored and re-pinned (the new plan is validated first, so bad input leaves the
    folder as it is: still patched, not restored)."""
    if manifest.get("mode") != "in-place":
        raise BadInputError(
            f"{root} is a pypto-patch overlay of {manifest.get('source_path')}; re-run with "
            f"--model-path {manifest.get('source_path')} --output-dir {root} --replace-overlay instead"
        )
    st = status_from_manifest(root, manifest)
    ours = frozenset(f["backup"] for f in manifest["files"] if f.get("backup"))
    fresh = make_plan(root, preset, in_place=True, known_backups=ours)
    if manifest.get("fingerprint") != preset.fingerprint or not st.intact:
        return None
    if not all(c.action == "unchanged" for c in fresh.changes):
        return None
    res = PatchResult(shown, str(root), "in-place", "unchanged", preset.family, preset.version)
    res.changes = [FileChange.from_record(f) for f in manifest["files"]]
    res.auto_map = dict(preset.auto_map)
    res.removed_auto_map = list(manifest.get("removed_auto_map", []))
    log.debug("%s is already pinned to %s %s: nothing to do", root, preset.family, preset.version)
    return res


def execute_apply(plan: Plan) -> None:
    """Carry out ``plan`` in place: journal, backups, files (config.json last), manifest.

    An error before the manifest (the commit point) is rolled back here; a crash is rolled
    back by the next run (:func:`recover`).
    """
    root = plan.root
    txn = uuid.uuid4().hex
    files = [asdict(c) for c in plan.changes if c.action != "unchanged"]
    journal = journal_doc(root, "apply", txn, files, plan.created_dirs)
    write_record(root / JOURNAL_NAME, journal)
    fault_point("apply:journal-written")
    try:
        _write_plan(plan)
        fault_point("apply:config-written")
        doc = manifest_doc(
            plan, txn, mode="in-place", source=root, purged=[], folder=folder_identity(root)
        )
        write_record(root / MANIFEST_NAME, doc)
        fault_point("apply:manifest-written")
    except BaseException as err:
        try:
            rollback_apply(root, journal)
        except Exception as rb_err:  # pragma: no cover - double fault
            raise PatchFailedError(
                f"apply failed ({err}) and the rollback failed too ({rb_err}); the journal {root / JOURNAL_NAME} lists what to undo"
            ) from err
        if isinstance(err, PatchError):
            raise
        if isinstance(err, OSError):
            raise PatchFailedError(
                f"writing into {root} failed ({err}); the folder was rolled back unchanged"
            ) from err
        raise
    os.unlink(root / JOURNAL_NAME)
    fsync_dir(root)
    log.debug("patched %s with %s %s", root, plan.preset.family, plan.preset.version)


def _write_plan(plan: Plan) -> None:
    """Backups first, then folders, then each file in plan order (config.json is last)."""
    root = plan.root
    for c in plan.changes:
        if c.action in ("replaced", "removed"):
            assert c.backup is not None
            make_backup(root / c.path, root / c.backup)
    fault_point("apply:backups-made")
    for d in plan.created_dirs:
        os.mkdir(root / d)
    first = True
    for c in plan.changes:
        if c.action == "unchanged":
            continue
        if c.action == "removed":
            os.unlink(root / c.path)
            fsync_dir((root / c.path).parent)
        else:
            atomic_write(root / c.path, plan.contents[c.path], c.mode)
        if first:
            fault_point("apply:first-file-written")
            first = False


# --------------------------------------------------------------------------- recovery


def rollback_apply(root: Path, journal: Mapping[str, Any]) -> None:
    """Undo a not-yet-committed apply; safe to run again if interrupted itself."""
    for f in reversed(journal.get("files", [])):
        path = root / f["path"]
        for t in (tmp_path_for(path), tmp_path_for(root / (f.get("backup") or f["path"]))):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(t)
        if f["action"] in ("replaced", "removed") and f.get("backup"):
            backup = root / f["backup"]
            if os.path.lexists(backup):
                put_back(backup, path)
        elif f["action"] == "created" and os.path.lexists(path):
            if not path.is_symlink() and sha_or_none(path) == f["patched_sha256"]:
                os.unlink(path)
            else:
                log.warning("left %s in place: it is not the file this run wrote", path)
    for d in reversed(journal.get("created_dirs", [])):
        with contextlib.suppress(OSError):
            os.rmdir(root / d)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp_path_for(root / MANIFEST_NAME))
    fsync_dir(root)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(root / JOURNAL_NAME)
    fsync_dir(root)


def recover(root: Path) -> str | None:
    """Finish what a crashed run left: roll back an apply, roll forward a restore.

    Both records are checked (bound to ``root``, paths inside it) before either steers
    a single rename: a journal shipped in a repo is refused, never "rolled back".
    """
    journal = load_journal(root)
    if journal is None:
        return None
    manifest = load_manifest(root)
    if journal["op"] == "apply":
        if manifest is not None and manifest.get("transaction") == journal.get("transaction"):
            os.unlink(root / JOURNAL_NAME)  # the manifest (commit point) made it: complete
            log.warning("%s: an interrupted apply had committed; finished it", root)
            return "completed"
        rollback_apply(root, journal)
        log.warning("%s: rolled back an interrupted apply", root)
        return "rolled-back"
    run_restore(root, journal)
    log.warning("%s: finished an interrupted restore", root)
    return "completed"


# --------------------------------------------------------------------------- restore


def restore_folder(root: Path, *, force: bool, lock_timeout: float) -> RestoreResult:
    """Return the in-place pinned ``root`` to its original bytes (or finish a crashed run)."""
    with dir_lock(root, timeout=lock_timeout):
        journal = load_journal(root)
        manifest = load_manifest(root)
        if manifest is None and journal is None:
            raise NotPatchedError(
                f"{root} is not patched by pypto-patch (no {MANIFEST_NAME}); nothing to restore"
            )
        if manifest is not None and manifest.get("mode") == "overlay":
            raise BadInputError(
                f"{root} is an overlay of {manifest.get('source_path')} (the original was never changed); delete {root} to drop it"
            )
        require_writable(root, hint="make it writable (chmod u+w) to restore it")
        recovered = recover(root)
        manifest = load_manifest(root)
        if manifest is None:
            return RestoreResult(str(root), "recovered", recovered=recovered)
        res = restore_in_place(root, manifest, force=force)
        res.recovered = recovered
        return res


def restore_in_place(root: Path, manifest: Mapping[str, Any], *, force: bool) -> RestoreResult:
    """Restore ``root`` from ``manifest`` (the caller holds the lock): refused when a
    backup is damaged, or a patched file was edited and ``force`` is not given."""
    st = status_from_manifest(root, manifest)
    if st.backups_damaged:
        raise ModifiedSincePatchError(
            f"backups {st.backups_damaged} in {root} are missing or changed, so the exact original cannot be restored; "
            "recover them by hand (or re-download those files)"
        )
    if st.changed_since and not force:
        raise ModifiedSincePatchError(
            f"{len(st.changed_since)} patched file(s) in {root} changed since the patch ({', '.join(st.changed_since)}); "
            "re-run with --force to restore and keep your edits as <name>.pypto_edited"
        )
    files = []
    for f in manifest["files"]:
        if f["action"] == "unchanged":
            continue
        entry = dict(f)
        if f["path"] in st.changed_since and os.path.lexists(root / f["path"]):
            entry["aside"] = aside_name(root / f["path"]).relative_to(root).as_posix()
        files.append(entry)
    journal = journal_doc(
        root, "restore", manifest["transaction"], files, list(manifest.get("created_dirs", []))
    )
    keys = modcache.folder_cache_keys(root)
    write_record(root / JOURNAL_NAME, journal)
    fault_point("restore:journal-written")
    res = run_restore(root, journal)
    res.cache_purged = modcache.purge([keys])
    return res


def run_restore(root: Path, journal: Mapping[str, Any]) -> RestoreResult:
    """Carry out a restore journal. Idempotent: a crash part way is finished by running
    it again from the journal."""
    res = RestoreResult(str(root), "restored")
    first = True
    for f in journal["files"]:
        _restore_entry(root, f, res)
        if first:
            fault_point("restore:first-file-restored")
            first = False
    for d in reversed(journal.get("created_dirs", [])):
        with contextlib.suppress(OSError):
            os.rmdir(root / d)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(root / MANIFEST_NAME)
    fsync_dir(root)
    fault_point("restore:manifest-removed")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(root / JOURNAL_NAME)
    fsync_dir(root)
    log.debug("restored %s to its original files", root)
    return res


def _restore_entry(root: Path, f: Mapping[str, Any], res: RestoreResult) -> None:
    """One journal entry: keep an edited file aside, then put the original back."""
    path = root / f["path"]
    aside = f.get("aside")
    if aside and not os.path.lexists(root / aside) and os.path.lexists(path):
        cur = sha_or_none(path)
        if cur not in (
            f["patched_sha256"],
            f.get("original_sha256"),
        ) or path.is_symlink() != f.get("original_is_symlink", False):
            os.replace(path, root / aside)
            res.kept_aside[f["path"]] = aside
    elif aside and os.path.lexists(root / aside):
        res.kept_aside[f["path"]] = aside
    if f["action"] in ("replaced", "removed"):
        backup = root / f["backup"]
        if os.path.lexists(backup):
            put_back(backup, path)
        res.restored.append(f["path"])
    elif f["action"] == "created":
        if (
            os.path.lexists(path)
            and not path.is_symlink()
            and sha_or_none(path) == f["patched_sha256"]
        ):
            os.unlink(path)
        res.removed.append(f["path"])
