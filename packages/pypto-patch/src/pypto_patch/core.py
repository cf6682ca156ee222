"""apply / status / restore: the library's front door, behind the CLI.

Each call checks its input and hands the work to the module that owns it:

* :mod:`pypto_patch.plan` chooses the preset and computes every change first (bad input
  changes nothing);
* :mod:`pypto_patch.inplace` pins the folder itself as one undoable transaction
  (journal, hard-link backups, atomic writes, config.json last, the manifest as commit
  point) and restores it; a crashed run is rolled back or finished by the next one;
* :mod:`pypto_patch.overlay` builds a new folder of links plus changed copies instead;
* :mod:`pypto_patch.records` reads and writes the manifest and journal, each proven to
  be ours for this very folder (:mod:`pypto_patch.bookkeeping`) before it steers anything.

The names once defined here (results, ``read_manifest``, ``FAULT_POINTS``, ...) are
re-exported so ``from pypto_patch.core import X`` keeps working.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .errors import BadInputError
from .fsops import FAULT_POINTS, LOCK_TIMEOUT_S, dir_lock
from .inplace import apply_in_place, restore_folder
from .modelfolder import resolve_folder
from .overlay import apply_overlay
from .plan import build_preset, check_folder_fits
from .presets import Preset
from .records import (
    MANIFEST_SCHEMA_VERSION,
    load_journal,
    load_manifest,
    read_manifest,
    status_from_manifest,
)
from .results import FileChange, PatchResult, RestoreResult, StatusResult

__all__ = [
    "FAULT_POINTS",
    "LOCK_TIMEOUT_S",
    "MANIFEST_SCHEMA_VERSION",
    "FileChange",
    "PatchResult",
    "RestoreResult",
    "StatusResult",
    "apply",
    "read_manifest",
    "restore",
    "status",
]


def apply(
    model_path: str | os.PathLike[str],
    *,
    family: str | None = None,
    preset: Preset | Mapping[str, Any] | None = None,
    auto_map: Mapping[str, Any] | None = None,
    copies: Mapping[str, str | os.PathLike[str]] | None = None,
    source_root: str | os.PathLike[str] | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
    replace_overlay: bool = False,
    dry_run: bool = False,
    lock_timeout: float = LOCK_TIMEOUT_S,
) -> PatchResult:
    """Pin ``model_path`` to a preset's (or custom) modules, in place or as an overlay.

    ``force`` re-pins over an existing pin whose files were edited (the edits are kept
    as ``<name>.pypto_edited``; in an overlay they are discarded). ``replace_overlay``
    lets an overlay pypto-patch built earlier at ``output_dir`` be replaced; anything
    else in a non-empty ``output_dir`` is refused whatever the flags.
    Raises a :class:`PatchError` subclass; bad input leaves the disk untouched.
    """
    root = resolve_folder(model_path)
    if replace_overlay and output_dir is None:
        raise BadInputError(
            "--replace-overlay only applies with --output-dir (it replaces an earlier overlay there)"
        )
    chosen = build_preset(family, preset, auto_map, copies, source_root)
    check_folder_fits(root, chosen)
    if output_dir is not None:
        return apply_overlay(
            root,
            chosen,
            output_dir,
            force=force,
            replace_overlay=replace_overlay,
            dry_run=dry_run,
            lock_timeout=lock_timeout,
        )
    return apply_in_place(
        root,
        chosen,
        model_path=model_path,
        force=force,
        dry_run=dry_run,
        lock_timeout=lock_timeout,
    )


def status(
    model_path: str | os.PathLike[str], *, lock_timeout: float = LOCK_TIMEOUT_S
) -> StatusResult:
    """Whether and how a folder is patched, and what changed since; never writes."""
    root = resolve_folder(model_path)
    with dir_lock(root, shared=True, timeout=lock_timeout):
        interrupted = load_journal(root) is not None
        manifest = load_manifest(root)
        st = (
            StatusResult(str(root), False)
            if manifest is None
            else status_from_manifest(root, manifest)
        )
        st.interrupted = interrupted
    return st


def restore(
    model_path: str | os.PathLike[str], *, force: bool = False, lock_timeout: float = LOCK_TIMEOUT_S
) -> RestoreResult:
    """Return an in-place patched folder to its exact original bytes and drop the manifest.

    Patched files edited since the patch are kept: the call refuses unless ``force``,
    and then moves each edited file aside as ``<name>.pypto_edited`` before restoring.
    """
    root = resolve_folder(model_path)
    return restore_folder(root, force=force, lock_timeout=lock_timeout)
