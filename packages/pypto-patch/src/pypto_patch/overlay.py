"""Overlay mode: a new folder of links to the model plus real copies of what changes.

The original folder is only read. Every top-level entry is linked with an absolute
target (a relative ``--model-path`` must not produce links that break when the
overlay is opened from elsewhere), and a sub-folder that receives a file is made a
real folder in the overlay first, so a write never goes through a link into the
original. The overlay is built under a temp name next to OUT and renamed into place,
so OUT is either the old folder or the complete new overlay.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from pathlib import Path

from . import modcache
from .core import (
    FileChange,
    PatchResult,
    _manifest_doc,
    _plan,
    _read_config,
    _read_json,
    _require_writable,
    _status_from_manifest,
    _write_json,
)
from .errors import BadInputError, OutputDirError
from .fsops import atomic_write, dir_lock, fault_point, fsync_dir
from .presets import JOURNAL_NAME, MANIFEST_NAME, Preset

log = logging.getLogger(__name__)

BUILDING_SUFFIX = ".pypto_building"
REPLACED_SUFFIX = ".pypto_replaced"


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def _check_output(root: Path, out_given: str | os.PathLike[str]) -> Path:
    """OUT as an absolute path; refuses any overlap with the model folder, with or without --force."""
    out = Path(os.path.abspath(os.path.expanduser(os.fspath(out_given))))
    real = Path(os.path.realpath(out))
    if _inside(real, root) or _inside(out, root):
        raise OutputDirError(
            f"--output-dir {out} is the model folder or inside it; choose a folder outside {root}"
        )
    if _inside(root, real) or _inside(root, out):
        raise OutputDirError(
            f"--output-dir {out} contains the model folder {root}; choose another folder"
        )
    if out.is_symlink():
        raise OutputDirError(f"--output-dir {out} is a symbolic link; give a real folder path")
    if os.path.lexists(out) and not out.is_dir():
        raise OutputDirError(f"--output-dir {out} exists and is not a folder; choose another path")
    return out


def _link_entries(src_dir: Path, dst_dir: Path, *, skip: set[str]) -> None:
    for entry in sorted(os.listdir(src_dir)):
        if entry in skip:
            continue
        os.symlink(os.path.abspath(src_dir / entry), dst_dir / entry)


def _recover_output(out: Path) -> None:
    """Undo what a crashed overlay build left next to OUT."""
    building = out.parent / f".{out.name}{BUILDING_SUFFIX}"
    replaced = out.parent / f".{out.name}{REPLACED_SUFFIX}"
    if os.path.lexists(replaced):
        if not os.path.lexists(out):
            os.rename(
                replaced, out
            )  # died between moving the old OUT aside and moving the new one in
        else:
            shutil.rmtree(replaced)
    if os.path.lexists(building):
        shutil.rmtree(building)


def apply_overlay(
    root: Path,
    preset: Preset,
    output_dir: str | os.PathLike[str],
    *,
    force: bool,
    dry_run: bool,
    lock_timeout: float,
) -> PatchResult:
    """Build (or keep, when identical) an overlay of ``root`` at ``output_dir``."""
    _read_config(root)
    own = _read_json(root / MANIFEST_NAME)
    if own is not None:
        raise BadInputError(
            f"{root} is itself patched ({own.get('mode')}); restore it first, or use its source folder as --model-path"
        )
    out = _check_output(root, output_dir)
    plan = _plan(root, preset, in_place=False)
    existing = out.is_dir() and any(out.iterdir())
    res = PatchResult(str(out), str(root), "overlay", "applied", preset.family, preset.version)
    res.auto_map = dict(preset.auto_map)
    res.changes, res.created_dirs = plan.changes, plan.created_dirs
    if existing:
        manifest = _read_json(out / MANIFEST_NAME) if (out / MANIFEST_NAME).is_file() else None
        same = (
            manifest is not None
            and manifest.get("mode") == "overlay"
            and manifest.get("source_path") == str(root)
            and manifest.get("fingerprint") == preset.fingerprint
        )
        if (
            same
            and _status_from_manifest(out, manifest).intact
            and not _status_from_manifest(out, manifest).source_changed
        ):
            res.action = "unchanged" if not dry_run else "dry-run:unchanged"
            res.changes = [FileChange(**f) for f in manifest["files"]]
            return res
        if not force:
            raise OutputDirError(
                f"--output-dir {out} is not empty; pass --force to replace it (or choose an empty folder)"
            )
    if dry_run:
        res.action = "dry-run"
        return res
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    _require_writable(parent, hint="choose an --output-dir in a writable place")
    with dir_lock(root, shared=True, timeout=lock_timeout), dir_lock(parent, timeout=lock_timeout):
        _recover_output(out)
        old_keys = modcache.folder_cache_keys(out, output_dir) if out.is_dir() else None
        building = parent / f".{out.name}{BUILDING_SUFFIX}"
        try:
            _build(building, root, plan)
            fault_point("overlay:built")
            if os.path.lexists(out):
                replaced = parent / f".{out.name}{REPLACED_SUFFIX}"
                os.rename(out, replaced)
                fault_point("overlay:old-moved-aside")
                os.rename(building, out)
                shutil.rmtree(replaced)
            else:
                os.rename(building, out)
            fsync_dir(parent)
        except BaseException:
            with contextlib.suppress(OSError):
                _recover_output(out)
            raise
        res.cache_purged = modcache.purge([old_keys]) if old_keys else []
    log.info("built overlay %s of %s with %s %s", out, root, preset.family, preset.version)
    return res


def _build(building: Path, root: Path, plan) -> None:
    building.mkdir()
    _link_entries(root, building, skip={MANIFEST_NAME, JOURNAL_NAME})
    materialized: list[str] = []
    for c in plan.changes:
        if c.action == "unchanged":
            continue
        parts = c.path.split("/")
        src_dir, dst_dir = root, building
        for part in parts[:-1]:
            src_dir, dst_dir = src_dir / part, dst_dir / part
            if dst_dir.is_symlink():
                # Make this level real: link its children instead of writing through the link.
                os.unlink(dst_dir)
                dst_dir.mkdir()
                _link_entries(src_dir, dst_dir, skip=set())
                materialized.append(dst_dir.relative_to(building).as_posix())
            elif not dst_dir.exists():
                dst_dir.mkdir()
        target = building / c.path
        if os.path.lexists(target):
            os.unlink(target)  # a link into the original: replace the link, never its target
        atomic_write(target, plan.contents[c.path], c.mode)
    doc = _manifest_doc(plan, uuid.uuid4().hex, mode="overlay", source=root, purged=[])
    doc["materialized_dirs"] = materialized
    _write_json(building / MANIFEST_NAME, doc)
