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
* an flock on the folder keeps two runs from interleaving.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import __version__ as TOOL_VERSION
from . import modcache
from .errors import (
    BadInputError,
    ConfigError,
    ModelFolderError,
    ModifiedSincePatchError,
    NotPatchedError,
    PatchError,
    PatchFailedError,
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
from .presets import (
    BACKUP_SUFFIX,
    EDITED_SUFFIX,
    JOURNAL_NAME,
    MANIFEST_NAME,
    Preset,
    auto_map_modules,
    custom_preset,
    get_preset,
    normalize_dest,
)

log = logging.getLogger(__name__)

MANIFEST_SCHEMA_VERSION = 1
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
    """One file the patch writes; ``action`` is replaced / created / unchanged."""

    path: str
    action: str
    patched_sha256: str
    original_sha256: str | None = None
    original_is_symlink: bool = False
    backup: str | None = None
    mode: int = 0o644


@dataclass
class PatchResult:
    """What ``apply`` did (or, with dry_run, would do)."""

    model_path: str
    source_path: str
    mode: str
    action: str  # applied | unchanged | dry-run
    family: str
    preset_version: str
    changes: list[FileChange] = field(default_factory=list)
    created_dirs: list[str] = field(default_factory=list)
    restored_first: bool = False
    recovered: str | None = None
    cache_purged: list[str] = field(default_factory=list)
    auto_map: dict[str, Any] = field(default_factory=dict)

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


def _read_config(root: Path) -> tuple[dict[str, Any], bytes]:
    path = root / "config.json"
    if not path.is_file():
        raise ModelFolderError(
            f"{root} has no config.json; point --model-path at the model folder that holds it"
        )
    raw = path.read_bytes()
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); re-download it"
        ) from None
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{path} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}; fix or re-download it"
        ) from None
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


def _merged_config_bytes(config: dict[str, Any], auto_map: Mapping[str, Any]) -> bytes:
    """config.json with the preset's auto_map merged in: preset keys win, the others stay."""
    merged = dict(config.get("auto_map") or {})
    merged.update(auto_map)
    new = dict(config)
    new["auto_map"] = merged
    return (json.dumps(new, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


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


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise PatchError(
            f"{path} is unreadable ({err}); it belongs to pypto-patch: move it away and retry"
        ) from None
    if not isinstance(data, dict):
        raise PatchError(f"{path} is not a pypto-patch record; move it away and retry")
    return data


def read_manifest(model_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest of a patched folder, or None."""
    return _read_json(Path(model_path) / MANIFEST_NAME)


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


def _plan(
    root: Path, preset: Preset, *, in_place: bool, known_backups: frozenset[str] = frozenset()
) -> _Plan:
    config, _raw = _read_config(root)
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
            backup = f"{rel}{BACKUP_SUFFIX}"
            if in_place and backup not in known_backups and os.path.lexists(root / backup):
                raise BadInputError(
                    f"{root / backup} already exists but no pypto-patch manifest records it (left by an older patch script?); "
                    "move it back over the original or away, then retry"
                )
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

    for rel in dests:
        parts = rel.split("/")
        cur = root
        for part in parts[:-1]:
            cur = cur / part
            if cur.is_symlink() and in_place:
                raise UnsafePathError(
                    f"{cur} is a symbolic link; writing {rel} through it would change files outside the folder; use --output-dir"
                )
            if os.path.lexists(cur) and not cur.is_dir():
                raise UnsafePathError(f"{cur} is a file, but {rel} needs it to be a folder")
            if not os.path.lexists(cur):
                rc = cur.relative_to(root).as_posix()
                if rc not in created_dirs:
                    created_dirs.append(rc)
        add(rel, preset.files[rel])
    add("config.json", _merged_config_bytes(config, preset.auto_map))  # last: the switch
    return _Plan(root, preset, config, changes, contents, created_dirs)


def _manifest_doc(
    plan: _Plan, txn: str, *, mode: str, source: Path, purged: list[str]
) -> dict[str, Any]:
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "tool": "pypto-patch",
        "tool_version": TOOL_VERSION,
        "created_at": _now(),
        "transaction": txn,
        "mode": mode,
        "source_path": str(source),
        "preset": plan.preset.to_summary(),
        "fingerprint": plan.preset.fingerprint,
        "auto_map_before": plan.config.get("auto_map"),
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
        if f["action"] == "replaced" and f.get("backup"):
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
    """Finish what a crashed run left: roll back an apply, roll forward a restore."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(
            tmp_path_for(root / JOURNAL_NAME)
        )  # died while writing the journal: nothing else happened
    journal = _read_json(root / JOURNAL_NAME)
    if journal is None:
        return None
    manifest = _read_json(root / MANIFEST_NAME)
    if journal.get("op") == "apply":
        if manifest is not None and manifest.get("transaction") == journal.get("transaction"):
            os.unlink(
                root / JOURNAL_NAME
            )  # the manifest (commit point) made it: the patch is complete
            log.warning("%s: an interrupted apply had committed; finished it", root)
            return "completed"
        _rollback_apply(root, journal)
        log.warning("%s: rolled back an interrupted apply", root)
        return "rolled-back"
    if journal.get("op") == "restore":
        _do_restore(root, journal)
        log.warning("%s: finished an interrupted restore", root)
        return "completed"
    raise PatchError(
        f"{root / JOURNAL_NAME} has an unknown op; move it away and check the folder by hand"
    )


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
    dry_run: bool = False,
    lock_timeout: float = LOCK_TIMEOUT_S,
) -> PatchResult:
    """Pin ``model_path``'s auto_map to a preset's (or custom) modules, in place or as an overlay.

    Raises a :class:`PatchError` subclass; bad input leaves the disk untouched.
    """
    root = _resolve_folder(model_path)
    chosen = _build_preset(family, preset, auto_map, copies, source_root)
    if output_dir is not None:
        from .overlay import apply_overlay

        return apply_overlay(
            root, chosen, output_dir, force=force, dry_run=dry_run, lock_timeout=lock_timeout
        )
    shown = os.path.abspath(os.path.expanduser(os.fspath(model_path)))
    _read_config(root)  # bad input must surface before anything else, lock included

    if dry_run:
        manifest = read_manifest(root)
        plan = _plan(root, chosen, in_place=True) if manifest is None else None
        res = PatchResult(shown, str(root), "in-place", "dry-run", chosen.family, chosen.version)
        res.auto_map = dict(chosen.auto_map)
        res.restored_first = (
            manifest is not None and manifest.get("fingerprint") != chosen.fingerprint
        )
        if manifest is not None and not res.restored_first:
            res.action = "dry-run:unchanged"
        if plan is not None:
            res.changes, res.created_dirs = plan.changes, plan.created_dirs
        return res

    _require_writable(
        root, hint="make it writable (chmod u+w) or build an overlay elsewhere with --output-dir"
    )
    with dir_lock(root, timeout=lock_timeout):
        recovered = _recover(root)
        manifest = read_manifest(root)
        restored_first = False
        if manifest is not None:
            if manifest.get("mode") != "in-place":
                raise BadInputError(
                    f"{root} is a pypto-patch overlay of {manifest.get('source_path')}; re-run with "
                    f"--model-path {manifest.get('source_path')} --output-dir {root} --force instead"
                )
            st = _status_from_manifest(root, manifest)
            if manifest.get("fingerprint") == chosen.fingerprint and st.intact:
                res = PatchResult(
                    shown, str(root), "in-place", "unchanged", chosen.family, chosen.version
                )
                res.changes = [FileChange(**f) for f in manifest["files"]]
                res.recovered = recovered
                res.auto_map = dict(chosen.auto_map)
                log.info(
                    "%s is already patched with %s %s: nothing to do",
                    root,
                    chosen.family,
                    chosen.version,
                )
                return res
            # Validate the new plan before touching anything: bad input must leave the
            # folder as it is (still patched), not restored.
            ours = frozenset(f["backup"] for f in manifest["files"] if f.get("backup"))
            _plan(root, chosen, in_place=True, known_backups=ours)
            log.info(
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
            m = read_manifest(root) or {}
            m["cache_purged"] = purged
            _write_json(root / MANIFEST_NAME, m)
    res = PatchResult(shown, str(root), "in-place", "applied", chosen.family, chosen.version)
    res.changes, res.created_dirs = plan.changes, plan.created_dirs
    res.restored_first, res.recovered, res.cache_purged = restored_first, recovered, purged
    res.auto_map = dict(chosen.auto_map)
    return res


def _execute_apply(plan: _Plan) -> None:
    root = plan.root
    txn = uuid.uuid4().hex
    journal = {
        "op": "apply",
        "transaction": txn,
        "files": [asdict(c) for c in plan.changes if c.action != "unchanged"],
        "created_dirs": plan.created_dirs,
    }
    _write_json(root / JOURNAL_NAME, journal)
    fault_point("apply:journal-written")
    try:
        for c in plan.changes:
            if c.action == "replaced":
                make_backup(root / c.path, root / c.backup)  # type: ignore[operator]
        fault_point("apply:backups-made")
        for d in plan.created_dirs:
            os.mkdir(root / d)
        first = True
        for c in plan.changes:
            if c.action == "unchanged":
                continue
            atomic_write(root / c.path, plan.contents[c.path], c.mode)
            if first:
                fault_point("apply:first-file-written")
                first = False
        fault_point("apply:config-written")
        _write_json(
            root / MANIFEST_NAME, _manifest_doc(plan, txn, mode="in-place", source=root, purged=[])
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
    log.info("patched %s with %s %s", root, plan.preset.family, plan.preset.version)


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
    )
    for f in manifest.get("files", []):
        if f["action"] == "unchanged":
            continue
        path = root / f["path"]
        if path.is_symlink() or _sha_or_none(path) != f["patched_sha256"]:
            st.changed_since.append(f["path"])
        if f.get("backup"):
            b = root / f["backup"]
            if not os.path.lexists(b) or _sha_or_none(b) != f.get("original_sha256"):
                st.backups_damaged.append(f["backup"])
        if st.mode == "overlay" and f["action"] == "replaced":
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
        interrupted = os.path.lexists(root / JOURNAL_NAME)
        manifest = read_manifest(root)
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
        manifest = read_manifest(root)
        if manifest is None and not os.path.lexists(root / JOURNAL_NAME):
            raise NotPatchedError(
                f"{root} is not patched by pypto-patch (no {MANIFEST_NAME}); nothing to restore"
            )
        if manifest is not None and manifest.get("mode") == "overlay":
            raise BadInputError(
                f"{root} is an overlay of {manifest.get('source_path')} (the original was never changed); delete {root} to drop it"
            )
        _require_writable(root, hint="make it writable (chmod u+w) to restore it")
        recovered = _recover(root)
        manifest = read_manifest(root)
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
    journal = {
        "op": "restore",
        "transaction": manifest.get("transaction"),
        "files": files,
        "created_dirs": manifest.get("created_dirs", []),
    }
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
        if f["action"] == "replaced":
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
    log.info("restored %s to its original files", root)
    return res
