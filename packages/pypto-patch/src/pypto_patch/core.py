"""apply / restore / status: the library behind the CLI.

The folder a user patches may be tens of GB they cannot download again, so every step
is built to be undone:

* nothing is written until the whole plan is validated (bad input changes nothing);
* a journal listing every intended change is written first; backups are hard links
  (the same inode, so a restore by rename is bit-exact, permissions included);
* each file is replaced atomically (temp file + rename), config.json last, so a
  loader never sees auto_map pointing at a module that is not there yet;
* the manifest write is the commit point; an error before it rolls back in process,
  and a crash before it is rolled back by the next apply/restore (which finish an
  interrupted restore instead);
* an flock on the folder keeps two runs from interleaving;
* a manifest or journal found in the folder is acted on only once it is proven to be
  ours, written for this very folder (see :mod:`pypto_patch.bookkeeping`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from . import __version__ as TOOL_VERSION
from . import modcache
from .bookkeeping import (
    TOOL,
    check_journal,
    check_manifest,
    folder_identity,
    read_record,
)
from .errors import (
    BadInputError,
    ConfigError,
    ModelFolderError,
    ModifiedSincePatchError,
    NotPatchedError,
    PatchError,
    PatchFailedError,
    PresetMismatchError,
    ReadOnlyFolderError,
    UnsafePathError,
)
from .fsops import (
    atomic_write,
    dir_lock,
    fault_point,
    file_mode,
    fsync_dir,
    make_backup,
    new_file_mode,
    sha256_bytes,
    sha256_file,
    tmp_path_for,
)
from .jsonio import JSONUnusable, dumps_config, loads_limited
from .names import (
    AUTO_MAP_FILES,
    BACKUP_SUFFIX,
    EDITED_SUFFIX,
    JOURNAL_NAME,
    MANIFEST_NAME,
    REMOTE_CODE_FILES,
)
from .pinning import BadImport, module_closure, pin_document
from .presets import Preset, auto_map_modules, custom_preset, get_preset, normalize_dest

log = logging.getLogger(__name__)

#: 2: records are bound to their folder ("folder"), auto_map files other than
#: config.json are pinned too, "removed" file actions, "removed_auto_map".
MANIFEST_SCHEMA_VERSION = 2
LOCK_TIMEOUT_S = 60.0

#: Named steps where a test can inject a crash (``PYPTO_PATCH_FAULT=<step>``).
FAULT_POINTS = (
    "apply:journal-written",
    "apply:backups-made",
    "apply:first-file-written",
    "apply:config-written",
    "apply:manifest-written",
    "restore:journal-written",
    "restore:first-file-restored",
    "restore:manifest-removed",
    "overlay:built",
    "overlay:old-moved-aside",
)


# --------------------------------------------------------------------------- results


@dataclass
class FileChange:
    """One file the patch touches; ``action`` is replaced / created / unchanged / removed.

    ``removed`` takes a file out of the pinned view (the repo's
    ``custom_generate/generate.py``); its ``patched_sha256`` is None.
    """

    path: str
    action: str
    patched_sha256: str | None
    original_sha256: str | None = None
    original_is_symlink: bool = False
    backup: str | None = None
    mode: int = 0o644

    @classmethod
    def from_record(cls, entry: Mapping[str, Any]) -> FileChange:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in entry.items() if k in names})


@dataclass
class PatchResult:
    """What ``apply`` did (or, with dry_run, would do).

    ``removed_auto_map`` lists every entry taken out of the pinned view
    (``{"file", "at", "key", "value"}``): the repo's own code it pointed at cannot run.
    """

    model_path: str
    source_path: str
    mode: str
    action: str  # applied | unchanged | dry-run | dry-run:unchanged
    family: str
    preset_version: str
    changes: list[FileChange] = field(default_factory=list)
    created_dirs: list[str] = field(default_factory=list)
    restored_first: bool = False
    recovered: str | None = None
    cache_purged: list[str] = field(default_factory=list)
    auto_map: dict[str, Any] = field(default_factory=dict)
    removed_auto_map: list[dict[str, Any]] = field(default_factory=list)
    replaced_overlay: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RestoreResult:
    model_path: str
    action: str  # restored | recovered
    restored: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept_aside: dict[str, str] = field(default_factory=dict)
    recovered: str | None = None
    cache_purged: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StatusResult:
    model_path: str
    patched: bool
    mode: str | None = None
    family: str | None = None
    preset_version: str | None = None
    distribution: str | None = None
    tool_version: str | None = None
    created_at: str | None = None
    source_path: str | None = None
    changed_since: list[str] = field(default_factory=list)
    backups_damaged: list[str] = field(default_factory=list)
    source_changed: list[str] = field(default_factory=list)
    interrupted: bool = False
    files: list[dict[str, Any]] = field(default_factory=list)
    removed_auto_map: list[dict[str, Any]] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return self.patched and not self.changed_since and not self.backups_damaged

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["intact"] = self.intact
        return d


# --------------------------------------------------------------------------- helpers


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _resolve_folder(model_path: str | os.PathLike[str]) -> Path:
    p = Path(model_path).expanduser()
    if not p.exists():
        raise ModelFolderError(
            f"model folder {os.fspath(model_path)!r} does not exist; check --model-path"
        )
    if not p.is_dir():
        raise ModelFolderError(
            f"{os.fspath(model_path)!r} is not a folder; --model-path must be the folder holding config.json"
        )
    return p.resolve()


def _load_json_file(path: Path) -> tuple[Any, bytes]:
    """A JSON file from the model folder; a one-line ConfigError names the file and the fix."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(
            f"{path} is unreadable ({err.strerror or err}); fix its permissions"
        ) from None
    try:
        return loads_limited(raw), raw
    except JSONUnusable as err:
        raise ConfigError(
            f"{path} is {err}; pypto-patch must read it to pin its auto_map: fix or re-download it"
        ) from None


def _read_config(root: Path) -> tuple[dict[str, Any], bytes]:
    path = root / "config.json"
    if not path.is_file():
        raise ModelFolderError(
            f"{root} has no config.json; point --model-path at the model folder that holds it"
        )
    data, raw = _load_json_file(path)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} holds a JSON {type(data).__name__}, not an object; re-download it"
        )
    am = data.get("auto_map")
    if am is not None and not isinstance(am, dict):
        raise ConfigError(
            f"{path}: 'auto_map' is a {type(am).__name__}, not an object; fix it by hand"
        )
    return data, raw


def _is_writable_dir(d: Path) -> bool:
    # Root ignores permission bits; a folder marked a-w is still treated as read-only
    # because the user said so.
    try:
        st = os.stat(d)
    except OSError:
        return False
    return os.access(d, os.W_OK | os.X_OK) and bool(st.st_mode & 0o222)


def _require_writable(d: Path, *, hint: str) -> None:
    if not _is_writable_dir(d):
        raise ReadOnlyFolderError(f"{d} is read-only; {hint}")


def _manifest(root: Path) -> dict[str, Any] | None:
    """The folder's manifest, proven to be ours and bound to ``root``; None if absent."""
    record = root / MANIFEST_NAME
    doc = read_record(record)
    if doc is not None:
        check_manifest(root, doc, record)
    return doc


def _journal(root: Path) -> dict[str, Any] | None:
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
    return _manifest(Path(model_path).expanduser().resolve())


def _write_json(path: Path, doc: Mapping[str, Any]) -> None:
    atomic_write(
        path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8"), new_file_mode()
    )


def _same_inode(a: Path, b: Path) -> bool:
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _put_back(backup: Path, path: Path) -> None:
    """Move the backup over ``path``; a no-op pair of hard links is untangled."""
    if _same_inode(backup, path):
        os.unlink(backup)  # rename() between two links to one inode does nothing
    else:
        os.replace(backup, path)


def _sha_or_none(path: Path) -> str | None:
    try:
        return sha256_file(path)
    except OSError:
        return None


def _aside_name(path: Path) -> Path:
    cand = path.parent / f"{path.name}{EDITED_SUFFIX}"
    n = 1
    while os.path.lexists(cand):
        cand = path.parent / f"{path.name}{EDITED_SUFFIX}.{n}"
        n += 1
    return cand


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


# --------------------------------------------------------------------------- presets


def _build_preset(
    family: str | None,
    preset: Preset | Mapping[str, Any] | None,
    auto_map: Mapping[str, Any] | None,
    copies: Mapping[str, str | os.PathLike[str]] | None,
    source_root: str | os.PathLike[str] | None,
) -> Preset:
    custom = bool(auto_map) or bool(copies)
    if (family is not None or preset is not None) and custom:
        raise BadInputError(
            "give either --model-family (a preset) or --auto-map/--copy (custom mode), not both"
        )
    if family is not None and preset is not None:
        raise BadInputError("give either a family name or a preset object, not both")
    if family is not None:
        return get_preset(family)
    if preset is not None:
        return preset if isinstance(preset, Preset) else Preset.from_dict(preset)
    if not custom:
        raise BadInputError(
            "nothing to apply: give --model-family FAMILY, or --auto-map KEY=VALUE / --copy DEST=SOURCE"
        )
    root = Path(source_root).expanduser() if source_root is not None else Path.cwd()
    files: dict[str, bytes] = {}
    for dest, src in (copies or {}).items():
        norm = normalize_dest(dest, what="--copy destination")
        src_path = Path(src).expanduser()
        if not src_path.is_absolute():
            src_path = root / src_path
        if src_path.is_dir():
            for f in sorted(p for p in src_path.rglob("*") if p.is_file()):
                files[
                    normalize_dest(
                        f"{norm}/{f.relative_to(src_path).as_posix()}", what="--copy destination"
                    )
                ] = f.read_bytes()
        elif src_path.is_file():
            files[norm] = src_path.read_bytes()
        else:
            raise BadInputError(
                f"--copy source {os.fspath(src)!r} does not exist (looked at {src_path}); check --source-root"
            )
    return custom_preset(dict(auto_map or {}), files)


# --------------------------------------------------------------------------- planning


@dataclass
class _Plan:
    root: Path
    preset: Preset
    config: dict[str, Any]
    changes: list[FileChange]
    contents: dict[str, bytes]
    created_dirs: list[str]
    removed_auto_map: list[dict[str, Any]]

    def signature(self) -> set[tuple[str, str, str | None]]:
        return {(c.path, c.action, c.patched_sha256) for c in self.changes}


def _record_signature(files: list[Mapping[str, Any]]) -> set[tuple[str, str, str | None]]:
    return {(f["path"], f["action"], f.get("patched_sha256")) for f in files}


def _check_folder_fits(root: Path, preset: Preset) -> None:
    """Run the preset's own config check before anything is written.

    Why: a Llama folder pinned with a Gemma 4 preset would otherwise be pinned happily
    and fail only at load time, after the folder was changed. The check comes from the
    model package (``check`` in its preset dict), so pypto-patch still names no family.
    """
    if preset.check is None:
        return
    config, _raw = _read_config(root)
    try:
        preset.check(config)
    except ValueError as err:
        detail = " ".join(str(err).split())
        raise PresetMismatchError(
            f"{root / 'config.json'} does not fit preset {preset.family!r}: {detail}"
        ) from None


def _plan(
    root: Path, preset: Preset, *, in_place: bool, known_backups: frozenset[str] = frozenset()
) -> _Plan:
    """Everything apply will change, computed and checked before anything is written.

    Besides placing the preset's files, the plan builds the pinned view: every auto_map
    in every file transformers reads one from points only at the preset's classes
    (entries it does not cover are removed and listed), and files transformers would
    import without an auto_map entry (``custom_generate/generate.py``) are taken out.
    """
    config, raw_config = _read_config(root)
    if preset.custom:
        present = {p.name[:-3] for p in root.iterdir() if p.name.endswith(".py")}
        placed = {d[:-3] for d in preset.files if d.endswith(".py") and "/" not in d}
        for stem in sorted(auto_map_modules(preset.auto_map)):
            if stem not in placed and stem not in present:
                raise BadInputError(
                    f"--auto-map names module {stem!r} but neither --copy places {stem}.py nor does the folder have it"
                )
    contents: dict[str, bytes] = {}
    changes: list[FileChange] = []
    created_dirs: list[str] = []
    dests = sorted(preset.files)
    for d in dests:
        for other in dests:
            if other.startswith(d + "/"):
                raise UnsafePathError(
                    f"{d!r} is placed as a file but {other!r} needs it to be a folder"
                )

    def check_parents(rel: str, *, creating: bool) -> None:
        cur = root
        for part in rel.split("/")[:-1]:
            cur = cur / part
            if cur.is_symlink() and in_place:
                raise UnsafePathError(
                    f"{cur} is a symbolic link; changing {rel} through it would change files outside the folder; use --output-dir"
                )
            if os.path.lexists(cur) and not cur.is_dir():
                raise UnsafePathError(f"{cur} is a file, but {rel} needs it to be a folder")
            if creating and not os.path.lexists(cur):
                rc = cur.relative_to(root).as_posix()
                if rc not in created_dirs:
                    created_dirs.append(rc)

    def check_backup_free(rel: str) -> str:
        backup = f"{rel}{BACKUP_SUFFIX}"
        if in_place and backup not in known_backups and os.path.lexists(root / backup):
            raise BadInputError(
                f"{root / backup} already exists but no pypto-patch manifest records it (left by an older patch script?); "
                "move it back over the original or away, then retry"
            )
        return backup

    def add(rel: str, data: bytes) -> None:
        path = root / rel
        contents[rel] = data
        if os.path.lexists(path):
            if path.is_dir() and not path.is_symlink():
                raise UnsafePathError(f"{path} is a folder; a preset file cannot replace it")
            cur = _sha_or_none(path)
            is_link = path.is_symlink()
            if cur == sha256_bytes(data):
                changes.append(
                    FileChange(rel, "unchanged", cur, cur, is_link, None, file_mode(path))
                )
                return
            backup = check_backup_free(rel)
            changes.append(
                FileChange(
                    rel,
                    "replaced",
                    sha256_bytes(data),
                    cur,
                    is_link,
                    backup if in_place else None,
                    file_mode(path),
                )
            )
        else:
            changes.append(FileChange(rel, "created", sha256_bytes(data), mode=new_file_mode()))

    # 1. Files transformers runs without being named by an auto_map: out of the view.
    for rel in REMOTE_CODE_FILES:
        path = root / rel
        if rel in preset.files or not path.is_file():
            continue
        check_parents(rel, creating=False)
        backup = check_backup_free(rel)
        changes.append(
            FileChange(
                rel,
                "removed",
                None,
                _sha_or_none(path),
                path.is_symlink(),
                backup if in_place else None,
                file_mode(path),
            )
        )
    # 2. The preset's files.
    for rel in dests:
        check_parents(rel, creating=True)
        add(rel, preset.files[rel])
    # 3. Custom mode may name a module the folder already has: the user vouches for it
    #    (and what it imports relatively), so record its bytes for verify_pinned.
    if preset.custom:
        recorded = {c.path for c in changes}

        def view(rel: str) -> bytes | None:
            if rel in preset.files:
                return preset.files[rel]
            if "/" in rel or not rel.endswith(".py"):
                return None
            return _read_or_none(root / rel)

        for stem in sorted(auto_map_modules(preset.auto_map)):
            try:
                closure = module_closure(view, f"{stem}.py")
            except BadImport as err:
                raise BadInputError(
                    f"{err}, which transformers would resolve outside the folder; fix that module"
                ) from None
            for rel in closure:
                path = root / rel
                if rel in recorded or rel in preset.files or "/" in rel or not path.is_file():
                    continue
                sha = _sha_or_none(path)
                changes.append(
                    FileChange(rel, "unchanged", sha, sha, path.is_symlink(), None, file_mode(path))
                )
                recorded.add(rel)
    # 4. Every other file transformers reads an auto_map from; config.json last (the switch).
    removed_map: list[dict[str, Any]] = []
    for fname in AUTO_MAP_FILES[1:]:
        path = root / fname
        if not path.is_file():
            continue
        doc, _raw = _load_json_file(path)
        changed, removed = pin_document(fname, doc, preset.auto_map)
        removed_map += removed
        if changed:
            add(fname, dumps_config(doc))
    pinned_config = loads_limited(raw_config)  # a fresh copy: ``config`` stays the original
    _changed, removed = pin_document("config.json", pinned_config, preset.auto_map)
    removed_map = removed + removed_map
    add("config.json", dumps_config(pinned_config))
    return _Plan(root, preset, config, changes, contents, created_dirs, removed_map)


def _manifest_doc(
    plan: _Plan,
    txn: str,
    *,
    mode: str,
    source: Path,
    purged: list[str],
    folder: Mapping[str, Any],
) -> dict[str, Any]:
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


# --------------------------------------------------------------------------- journal


def _rollback_apply(root: Path, journal: Mapping[str, Any]) -> None:
    """Undo a not-yet-committed apply; safe to run again if interrupted itself."""
    for f in reversed(journal.get("files", [])):
        path = root / f["path"]
        for t in (tmp_path_for(path), tmp_path_for(root / (f.get("backup") or f["path"]))):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(t)
        if f["action"] in ("replaced", "removed") and f.get("backup"):
            backup = root / f["backup"]
            if os.path.lexists(backup):
                _put_back(backup, path)
        elif f["action"] == "created" and os.path.lexists(path):
            if not path.is_symlink() and _sha_or_none(path) == f["patched_sha256"]:
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


def _recover(root: Path) -> str | None:
    """Finish what a crashed run left: roll back an apply, roll forward a restore.

    Both records are checked (bound to ``root``, paths inside it) before either steers
    a single rename: a journal shipped in a repo is refused, never "rolled back".
    """
    journal = _journal(root)
    if journal is None:
        return None
    manifest = _manifest(root)
    if journal["op"] == "apply":
        if manifest is not None and manifest.get("transaction") == journal.get("transaction"):
            os.unlink(root / JOURNAL_NAME)  # the manifest (commit point) made it: complete
            log.warning("%s: an interrupted apply had committed; finished it", root)
            return "completed"
        _rollback_apply(root, journal)
        log.warning("%s: rolled back an interrupted apply", root)
        return "rolled-back"
    _do_restore(root, journal)
    log.warning("%s: finished an interrupted restore", root)
    return "completed"


def _journal_doc(
    root: Path, op: str, txn: str, files: list[dict[str, Any]], dirs: list[str]
) -> dict[str, Any]:
    return {
        "tool": TOOL,
        "op": op,
        "transaction": txn,
        "folder": folder_identity(root),
        "files": files,
        "created_dirs": dirs,
    }


# --------------------------------------------------------------------------- apply


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
    root = _resolve_folder(model_path)
    if replace_overlay and output_dir is None:
        raise BadInputError(
            "--replace-overlay only applies with --output-dir (it replaces an earlier overlay there)"
        )
    chosen = _build_preset(family, preset, auto_map, copies, source_root)
    _check_folder_fits(root, chosen)
    if output_dir is not None:
        from .overlay import apply_overlay

        return apply_overlay(
            root,
            chosen,
            output_dir,
            force=force,
            replace_overlay=replace_overlay,
            dry_run=dry_run,
            lock_timeout=lock_timeout,
        )
    shown = os.path.abspath(os.path.expanduser(os.fspath(model_path)))
    _read_config(root)  # bad input must surface before anything else, lock included

    if dry_run:
        _journal(root)  # refuse forged records even when only planning
        manifest = _manifest(root)
        plan = _plan(root, chosen, in_place=True) if manifest is None else None
        res = PatchResult(shown, str(root), "in-place", "dry-run", chosen.family, chosen.version)
        res.auto_map = dict(chosen.auto_map)
        res.restored_first = (
            manifest is not None and manifest.get("fingerprint") != chosen.fingerprint
        )
        if manifest is not None and not res.restored_first:
            res.action = "dry-run:unchanged"
            res.removed_auto_map = list(manifest.get("removed_auto_map", []))
        if plan is not None:
            res.changes, res.created_dirs = plan.changes, plan.created_dirs
            res.removed_auto_map = plan.removed_auto_map
        return res

    _require_writable(
        root, hint="make it writable (chmod u+w) or build an overlay elsewhere with --output-dir"
    )
    with dir_lock(root, timeout=lock_timeout):
        # Both records are checked before _recover acts on either.
        _journal(root)
        _manifest(root)
        recovered = _recover(root)
        manifest = _manifest(root)
        restored_first = False
        if manifest is not None:
            if manifest.get("mode") != "in-place":
                raise BadInputError(
                    f"{root} is a pypto-patch overlay of {manifest.get('source_path')}; re-run with "
                    f"--model-path {manifest.get('source_path')} --output-dir {root} --replace-overlay instead"
                )
            st = _status_from_manifest(root, manifest)
            ours = frozenset(f["backup"] for f in manifest["files"] if f.get("backup"))
            if manifest.get("fingerprint") == chosen.fingerprint and st.intact:
                fresh = _plan(root, chosen, in_place=True, known_backups=ours)
                if all(c.action == "unchanged" for c in fresh.changes):
                    res = PatchResult(
                        shown, str(root), "in-place", "unchanged", chosen.family, chosen.version
                    )
                    res.changes = [FileChange.from_record(f) for f in manifest["files"]]
                    res.recovered = recovered
                    res.auto_map = dict(chosen.auto_map)
                    res.removed_auto_map = list(manifest.get("removed_auto_map", []))
                    log.debug(
                        "%s is already pinned to %s %s: nothing to do",
                        root,
                        chosen.family,
                        chosen.version,
                    )
                    return res
            else:
                # Validate the new plan before touching anything: bad input must leave
                # the folder as it is (still patched), not restored.
                _plan(root, chosen, in_place=True, known_backups=ours)
            log.debug(
                "%s is patched with %s: restoring it first", root, manifest["preset"]["family"]
            )
            _restore_locked(root, manifest, force=force)
            restored_first = True
        plan = _plan(root, chosen, in_place=True)
        for c in plan.changes:
            _require_writable(
                (root / c.path).parent if (root / c.path).parent.exists() else root,
                hint="make it writable",
            )
        old_keys = modcache.folder_cache_keys(root, model_path)
        _execute_apply(plan)
        purged = modcache.purge([old_keys])
        if purged:
            m = _manifest(root) or {}
            m["cache_purged"] = purged
            _write_json(root / MANIFEST_NAME, m)
    res = PatchResult(shown, str(root), "in-place", "applied", chosen.family, chosen.version)
    res.changes, res.created_dirs = plan.changes, plan.created_dirs
    res.restored_first, res.recovered, res.cache_purged = restored_first, recovered, purged
    res.auto_map = dict(chosen.auto_map)
    res.removed_auto_map = plan.removed_auto_map
    return res


def _execute_apply(plan: _Plan) -> None:
    root = plan.root
    txn = uuid.uuid4().hex
    journal = _journal_doc(
        root,
        "apply",
        txn,
        [asdict(c) for c in plan.changes if c.action != "unchanged"],
        plan.created_dirs,
    )
    _write_json(root / JOURNAL_NAME, journal)
    fault_point("apply:journal-written")
    try:
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
        fault_point("apply:config-written")
        _write_json(
            root / MANIFEST_NAME,
            _manifest_doc(
                plan,
                txn,
                mode="in-place",
                source=root,
                purged=[],
                folder=folder_identity(root),
            ),
        )
        fault_point("apply:manifest-written")
    except BaseException as err:
        try:
            _rollback_apply(root, journal)
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


# --------------------------------------------------------------------------- status


def _status_from_manifest(root: Path, manifest: Mapping[str, Any]) -> StatusResult:
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
        if f["action"] == "unchanged":
            continue
        path = root / f["path"]
        if f["action"] == "removed":
            if os.path.lexists(path):
                st.changed_since.append(f["path"])
        elif path.is_symlink() or _sha_or_none(path) != f["patched_sha256"]:
            st.changed_since.append(f["path"])
        if f.get("backup"):
            b = root / f["backup"]
            if not os.path.lexists(b) or _sha_or_none(b) != f.get("original_sha256"):
                st.backups_damaged.append(f["backup"])
        if st.mode == "overlay" and f["action"] in ("replaced", "removed"):
            src = Path(manifest.get("source_path", "")) / f["path"]
            if _sha_or_none(src) != f.get("original_sha256"):
                st.source_changed.append(f["path"])
    return st


def status(
    model_path: str | os.PathLike[str], *, lock_timeout: float = LOCK_TIMEOUT_S
) -> StatusResult:
    """Whether and how a folder is patched, and what changed since; never writes."""
    root = _resolve_folder(model_path)
    with dir_lock(root, shared=True, timeout=lock_timeout):
        interrupted = _journal(root) is not None
        manifest = _manifest(root)
        st = (
            StatusResult(str(root), False)
            if manifest is None
            else _status_from_manifest(root, manifest)
        )
        st.interrupted = interrupted
    return st


# --------------------------------------------------------------------------- restore


def restore(
    model_path: str | os.PathLike[str], *, force: bool = False, lock_timeout: float = LOCK_TIMEOUT_S
) -> RestoreResult:
    """Return an in-place patched folder to its exact original bytes and drop the manifest.

    Patched files edited since the patch are kept: the call refuses unless ``force``,
    and then moves each edited file aside as ``<name>.pypto_edited`` before restoring.
    """
    root = _resolve_folder(model_path)
    with dir_lock(root, timeout=lock_timeout):
        journal = _journal(root)
        manifest = _manifest(root)
        if manifest is None and journal is None:
            raise NotPatchedError(
                f"{root} is not patched by pypto-patch (no {MANIFEST_NAME}); nothing to restore"
            )
        if manifest is not None and manifest.get("mode") == "overlay":
            raise BadInputError(
                f"{root} is an overlay of {manifest.get('source_path')} (the original was never changed); delete {root} to drop it"
            )
        _require_writable(root, hint="make it writable (chmod u+w) to restore it")
        recovered = _recover(root)
        manifest = _manifest(root)
        if manifest is None:
            return RestoreResult(str(root), "recovered", recovered=recovered)
        res = _restore_locked(root, manifest, force=force)
        res.recovered = recovered
        return res


def _restore_locked(root: Path, manifest: Mapping[str, Any], *, force: bool) -> RestoreResult:
    st = _status_from_manifest(root, manifest)
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
            entry["aside"] = _aside_name(root / f["path"]).relative_to(root).as_posix()
        files.append(entry)
    journal = _journal_doc(
        root, "restore", manifest["transaction"], files, list(manifest.get("created_dirs", []))
    )
    keys = modcache.folder_cache_keys(root)
    _write_json(root / JOURNAL_NAME, journal)
    fault_point("restore:journal-written")
    res = _do_restore(root, journal)
    res.cache_purged = modcache.purge([keys])
    return res


def _do_restore(root: Path, journal: Mapping[str, Any]) -> RestoreResult:
    """Idempotent: a crash part way is finished by running it again from the journal."""
    res = RestoreResult(str(root), "restored")
    first = True
    for f in journal["files"]:
        path = root / f["path"]
        aside = f.get("aside")
        if aside and not os.path.lexists(root / aside) and os.path.lexists(path):
            cur = _sha_or_none(path)
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
                _put_back(backup, path)
            res.restored.append(f["path"])
        elif f["action"] == "created":
            if (
                os.path.lexists(path)
                and not path.is_symlink()
                and _sha_or_none(path) == f["patched_sha256"]
            ):
                os.unlink(path)
            res.removed.append(f["path"])
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
