"""Overlay mode: a new folder of links to the model plus real copies of what changes.

The original folder is only read. Every top-level entry is linked with an absolute
target (a relative ``--model-path`` must not produce links that break when the
overlay is opened from elsewhere), and a sub-folder that receives a file is made a
real folder in the overlay first, so a write never goes through a link into the
original. The overlay is built under a temp name next to OUT and renamed into place,
so OUT is either the old folder or the complete new overlay.

pypto-patch deletes a folder only when it can prove it built it: the first file it
writes into a new overlay is a marker (``.pypto_patch.overlay.json``) bound to OUT's
path and inode (see :func:`pypto_patch.bookkeeping.folder_identity`). A non-empty OUT
without a valid marker, or with one copied from another overlay, is never replaced,
whatever the flags; a valid one is replaced only with ``replace_overlay``, and never
while it holds files pypto-patch did not put there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from pypto_common import tool_owned_reason

from . import modcache
from .bookkeeping import TOOL, check_manifest, check_marker, folder_identity, read_record
from .errors import (
    BadInputError,
    ModifiedSincePatchError,
    OutputDirError,
    OverlayRefusedError,
    UnsafeBookkeepingError,
)
from .fsops import atomic_write, dir_lock, fault_point, fsync_dir, tmp_path_for
from .modelfolder import read_config, require_writable
from .names import MANIFEST_NAME, OVERLAY_MARKER_NAME
from .plan import Plan, make_plan
from .presets import Preset
from .records import (
    load_journal,
    load_manifest,
    manifest_doc,
    record_signature,
    status_from_manifest,
    write_record,
)
from .results import FileChange, PatchResult

log = logging.getLogger(__name__)

__all__ = ["BUILDING_SUFFIX", "REPLACED_SUFFIX", "apply_overlay", "overlay_links"]

BUILDING_SUFFIX = ".pypto_building"
REPLACED_SUFFIX = ".pypto_replaced"


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def _check_output(root: Path, out_given: str | os.PathLike[str]) -> Path:
    """OUT as an absolute path; refuses any overlap with the model folder, whatever the flags."""
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


def _final_path(out: Path) -> Path:
    """Where OUT lives once resolved: what its marker and manifest are bound to."""
    return Path(os.path.realpath(out.parent)) / out.name


def _link_entries(src_dir: Path, dst_dir: Path) -> None:
    for entry in sorted(os.listdir(src_dir)):
        if tool_owned_reason(entry) is not None:
            continue  # the source's own (or a repo's forged) bookkeeping is not ours to show
        os.symlink(os.path.abspath(src_dir / entry), dst_dir / entry)


def _earlier_overlay(out: Path) -> dict[str, Any]:
    """The manifest of the overlay pypto-patch built at ``out``, or OverlayRefusedError.

    Proof of ownership is a marker bound to ``out`` (path and inode) plus a manifest
    bound the same way with the same transaction id.
    """
    final = _final_path(out)
    marker_path = out / OVERLAY_MARKER_NAME
    try:
        marker = read_record(marker_path)
        if marker is None:
            raise OverlayRefusedError(
                f"--output-dir {out} is not empty and has no pypto-patch overlay marker "
                f"({OVERLAY_MARKER_NAME}); pypto-patch replaces only overlays it built there: "
                "choose an empty or new folder"
            )
        check_marker(out, marker, marker_path, expect_path=final)
        manifest = read_record(out / MANIFEST_NAME)
        if manifest is None:
            raise UnsafeBookkeepingError(f"{out / MANIFEST_NAME} is missing")
        check_manifest(out, manifest, out / MANIFEST_NAME)
        if manifest.get("mode") != "overlay" or manifest.get("transaction") != marker.get(
            "transaction"
        ):
            raise UnsafeBookkeepingError(
                f"{out / MANIFEST_NAME} does not belong to the marker {marker_path}"
            )
    except UnsafeBookkeepingError as err:
        raise OverlayRefusedError(
            f"--output-dir {out} is not empty and is not an overlay pypto-patch built there "
            f"({err}); it is never replaced: choose an empty or new folder"
        ) from None
    return manifest


def _foreign_entries(out: Path, manifest: dict[str, Any]) -> list[str]:
    """Real files and folders in an earlier overlay that pypto-patch did not put there.

    Links are never foreign: removing a link leaves its target alone.
    """
    files = {f["path"] for f in manifest["files"] if f["action"] in ("created", "replaced")}
    dirs = set(manifest.get("materialized_dirs", [])) | set(manifest.get("created_dirs", []))
    own = {MANIFEST_NAME, OVERLAY_MARKER_NAME}
    foreign: list[str] = []
    for dirpath, dirnames, filenames in os.walk(out):
        base = Path(dirpath)
        keep: list[str] = []
        for name in sorted(dirnames + filenames):
            p = base / name
            rel = p.relative_to(out).as_posix()
            if p.is_symlink() or rel in own or rel in files:
                continue
            if rel in dirs and p.is_dir():
                keep.append(name)
                continue
            foreign.append(rel)
        dirnames[:] = [d for d in dirnames if d in keep]
    return foreign


def _check_leftover(d: Path, out: Path) -> None:
    """Refuse to delete a ``.OUT.pypto_*`` folder unless pypto-patch made it for ``out``."""
    if d.is_symlink() or not d.is_dir():
        raise OverlayRefusedError(
            f"{d} is in the way and is not a folder pypto-patch left; move it away and retry"
        )
    marker_path = d / OVERLAY_MARKER_NAME
    try:
        marker = read_record(marker_path)
        if marker is None:
            # A build that died before its first write leaves at most the marker's temp file.
            if set(os.listdir(d)) <= {tmp_path_for(marker_path).name}:
                return
            raise UnsafeBookkeepingError(f"{marker_path} is missing")
        check_marker(d, marker, marker_path, expect_path=_final_path(out))
    except UnsafeBookkeepingError as err:
        raise OverlayRefusedError(
            f"{d} is in the way and pypto-patch cannot prove it left it ({err}); move it away and retry"
        ) from None


def _recover_output(out: Path) -> None:
    """Undo what a crashed overlay build left next to OUT (only folders proven ours)."""
    building = out.parent / f".{out.name}{BUILDING_SUFFIX}"
    replaced = out.parent / f".{out.name}{REPLACED_SUFFIX}"
    if os.path.lexists(replaced):
        _check_leftover(replaced, out)
        if not os.path.lexists(out):
            os.rename(replaced, out)  # died between moving the old OUT aside and the new one in
        else:
            shutil.rmtree(replaced)
    if os.path.lexists(building):
        _check_leftover(building, out)
        shutil.rmtree(building)


def _decide(
    out: Path, root: Path, preset: Preset, plan: Plan, *, force: bool, replace_overlay: bool
) -> dict[str, Any] | None:
    """The earlier overlay's manifest when it is already exactly this one (nothing to do).

    None means "build": OUT is empty or missing, or an earlier overlay may be replaced.
    Raises when OUT may not be replaced.
    """
    if not (out.is_dir() and any(out.iterdir())):
        return None
    manifest = _earlier_overlay(out)
    st = status_from_manifest(out, manifest)
    if (
        manifest.get("source_path") == str(root)
        and manifest.get("fingerprint") == preset.fingerprint
        and record_signature(manifest["files"]) == plan.signature()
        and st.intact
        and not st.source_changed
    ):
        return manifest
    if not replace_overlay:
        raise OverlayRefusedError(
            f"--output-dir {out} holds an earlier pypto-patch overlay ({st.family} {st.preset_version} "
            f"of {st.source_path}); pass --replace-overlay to replace it, or choose another folder"
        )
    foreign = _foreign_entries(out, manifest)
    if foreign:
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        raise OverlayRefusedError(
            f"--output-dir {out} is an earlier pypto-patch overlay but also holds files pypto-patch "
            f"did not put there ({shown}); move them out first, then retry"
        )
    if st.changed_since and not force:
        raise ModifiedSincePatchError(
            f"files in the overlay {out} were edited since it was built ({', '.join(st.changed_since)}); "
            "pass --force as well to discard those edits, or copy them out first"
        )
    return None


def apply_overlay(
    root: Path,
    preset: Preset,
    output_dir: str | os.PathLike[str],
    *,
    force: bool,
    replace_overlay: bool,
    dry_run: bool,
    lock_timeout: float,
) -> PatchResult:
    """Build (or keep, when identical) an overlay of ``root`` at ``output_dir``."""
    read_config(root)
    if load_journal(root) is not None:
        raise BadInputError(
            f"{root} has an interrupted pypto-patch run; run `pypto-patch restore --model-path {root}` first"
        )
    own = load_manifest(root)
    if own is not None:
        raise BadInputError(
            f"{root} is itself patched ({own.get('mode')}); restore it first, or use its source folder as --model-path"
        )
    out = _check_output(root, output_dir)
    plan = make_plan(root, preset, in_place=False)
    res = PatchResult(str(out), str(root), "overlay", "applied", preset.family, preset.version)
    res.auto_map = dict(preset.auto_map)
    res.changes, res.created_dirs = plan.changes, plan.created_dirs
    res.removed_auto_map = plan.removed_auto_map
    same = _decide(out, root, preset, plan, force=force, replace_overlay=replace_overlay)
    if same is not None:
        res.action = "unchanged" if not dry_run else "dry-run:unchanged"
        res.changes = [FileChange.from_record(f) for f in same["files"]]
        res.removed_auto_map = list(same.get("removed_auto_map", []))
        return res
    if dry_run:
        res.action = "dry-run"
        return res
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    require_writable(parent, hint="choose an --output-dir in a writable place")
    with dir_lock(root, shared=True, timeout=lock_timeout), dir_lock(parent, timeout=lock_timeout):
        _recover_output(out)
        # Decide again under the lock: OUT may have changed since the first look.
        same = _decide(out, root, preset, plan, force=force, replace_overlay=replace_overlay)
        if same is not None:
            res.action = "unchanged"
            res.changes = [FileChange.from_record(f) for f in same["files"]]
            res.removed_auto_map = list(same.get("removed_auto_map", []))
            return res
        old_keys = modcache.folder_cache_keys(out, output_dir) if out.is_dir() else None
        building = parent / f".{out.name}{BUILDING_SUFFIX}"
        try:
            _build(building, root, plan, final=_final_path(out))
            fault_point("overlay:built")
            if os.path.lexists(out):
                replaced = parent / f".{out.name}{REPLACED_SUFFIX}"
                os.rename(out, replaced)
                fault_point("overlay:old-moved-aside")
                os.rename(building, out)
                shutil.rmtree(replaced)
                res.replaced_overlay = True
            else:
                os.rename(building, out)
            fsync_dir(parent)
        except BaseException:
            with contextlib.suppress(OSError, OverlayRefusedError):
                _recover_output(out)
            raise
        res.cache_purged = modcache.purge([old_keys]) if old_keys else []
    log.debug("built overlay %s of %s with %s %s", out, root, preset.family, preset.version)
    return res


def _build(building: Path, root: Path, plan: Plan, *, final: Path) -> None:
    building.mkdir()
    txn = uuid.uuid4().hex
    ident = folder_identity(building, as_path=final)
    # The marker first: a build that dies part way is still recognisably ours.
    write_record(
        building / OVERLAY_MARKER_NAME,
        {
            "tool": TOOL,
            "kind": "overlay",
            "transaction": txn,
            "folder": ident,
            "source_path": str(root),
        },
    )
    _link_entries(root, building)
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
                _link_entries(src_dir, dst_dir)
                materialized.append(dst_dir.relative_to(building).as_posix())
            elif not dst_dir.exists():
                dst_dir.mkdir()
        target = building / c.path
        if os.path.lexists(target):
            os.unlink(target)  # a link into the original: replace the link, never its target
        if c.action != "removed":
            atomic_write(target, plan.contents[c.path], c.mode)
    doc = manifest_doc(plan, txn, mode="overlay", source=root, purged=[], folder=ident)
    doc["materialized_dirs"] = materialized
    write_record(building / MANIFEST_NAME, doc)


def overlay_links(model_path: str | os.PathLike[str]) -> dict[str, Path]:
    """The symbolic links pypto-patch made in the overlay at ``model_path``, as relative
    POSIX path -> the absolute target it made them point to (in the source folder).

    Derived from the overlay's own bookkeeping (its manifest and marker, proven to be
    pypto-patch's for this very folder): every top-level entry of the source, and every
    entry of a folder the overlay made real, except the files the manifest changed and
    pypto-patch's own names. A link is listed only while it still points exactly where
    it was made to; any other link in the folder (planted later, or edited) is not.
    Readers that must not follow links (strict weight loaders, size checks) follow
    exactly these. Empty for a folder that is not an overlay (no manifest, or pinned in
    place). Raises :class:`UnsafeBookkeepingError` when the folder holds bookkeeping
    pypto-patch did not write for it.
    """
    root = Path(os.fspath(model_path)).expanduser().resolve()
    manifest = load_manifest(root)
    if manifest is None or manifest.get("mode") != "overlay":
        return {}
    marker_path = root / OVERLAY_MARKER_NAME
    marker = read_record(marker_path)
    if marker is None:
        raise UnsafeBookkeepingError(
            f"{marker_path} is missing, so {root} is not an overlay pypto-patch can vouch for: "
            "rebuild it with pypto-patch apply --output-dir"
        )
    check_marker(root, marker, marker_path, expect_path=root)
    if marker.get("transaction") != manifest.get("transaction"):
        raise UnsafeBookkeepingError(
            f"{root / MANIFEST_NAME} does not belong to the marker {marker_path}: rebuild the "
            "overlay with pypto-patch apply --output-dir"
        )
    source = Path(manifest["source_path"])
    changed = {f["path"] for f in manifest["files"] if f.get("action") != "unchanged"}
    links: dict[str, Path] = {}
    for level in ["", *sorted(manifest.get("materialized_dirs", []))]:
        here = root / level if level else root
        if here.is_symlink() or not here.is_dir():
            continue
        for entry in sorted(os.listdir(here)):
            rel = f"{level}/{entry}" if level else entry
            path = here / entry
            if rel in changed or tool_owned_reason(rel) is not None or not path.is_symlink():
                continue
            made = os.path.abspath(source / rel)
            with contextlib.suppress(OSError):
                if os.readlink(path) == made:
                    links[rel] = Path(made)
    return links
