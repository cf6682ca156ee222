"""Planning: which preset, and every change ``apply`` will make, before anything is written.

A plan is computed and checked in full first, so bad input changes nothing on disk. Besides
placing the preset's files, the plan builds the pinned view: every auto_map in every file
transformers reads one from points only at the preset's classes (entries it does not
cover are removed and listed), and files transformers would import without an auto_map
entry (``custom_generate/generate.py``) are taken out. The same plan drives an in-place
pin (:mod:`pypto_patch.inplace`) and an overlay (:mod:`pypto_patch.overlay`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import BadInputError, PresetMismatchError, UnsafePathError
from .fsops import file_mode, new_file_mode, read_or_none, sha256_bytes, sha_or_none
from .jsonio import dumps_config, loads_limited
from .modelfolder import load_json_file, read_config
from .names import AUTO_MAP_FILES, BACKUP_SUFFIX, REMOTE_CODE_FILES
from .pinning import BadImport, module_closure, pin_document
from .presets import Preset, auto_map_modules, custom_preset, get_preset, normalize_dest
from .results import FileChange

__all__ = ["Plan", "build_preset", "check_folder_fits", "make_plan"]


@dataclass
class Plan:
    """Everything one apply changes: the files (with their new bytes), folders to create,
    and the auto_map entries the pinned view drops."""

    root: Path
    preset: Preset
    config: dict[str, Any]
    changes: list[FileChange]
    contents: dict[str, bytes]
    created_dirs: list[str]
    removed_auto_map: list[dict[str, Any]]

    def signature(self) -> set[tuple[str, str, str | None]]:
        """What the plan would leave: (path, action, sha256), comparable with a manifest's."""
        return {(c.path, c.action, c.patched_sha256) for c in self.changes}


# --------------------------------------------------------------------------- the preset


def build_preset(
    family: str | None,
    preset: Preset | Mapping[str, Any] | None,
    auto_map: Mapping[str, Any] | None,
    copies: Mapping[str, str | os.PathLike[str]] | None,
    source_root: str | os.PathLike[str] | None,
) -> Preset:
    """The preset apply uses: a family's, a given object, or one built from --auto-map/--copy."""
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
        files.update(_copied_files(dest, src, root))
    return custom_preset(dict(auto_map or {}), files)


def _copied_files(dest: str, src: str | os.PathLike[str], source_root: Path) -> dict[str, bytes]:
    """One ``--copy DEST=SOURCE``: a file, or every file under a folder, by destination."""
    norm = normalize_dest(dest, what="--copy destination")
    src_path = Path(src).expanduser()
    if not src_path.is_absolute():
        src_path = source_root / src_path
    if src_path.is_file():
        return {norm: src_path.read_bytes()}
    if not src_path.is_dir():
        raise BadInputError(
            f"--copy source {os.fspath(src)!r} does not exist (looked at {src_path}); check --source-root"
        )
    files: dict[str, bytes] = {}
    for f in sorted(p for p in src_path.rglob("*") if p.is_file()):
        rel = f"{norm}/{f.relative_to(src_path).as_posix()}"
        files[normalize_dest(rel, what="--copy destination")] = f.read_bytes()
    return files


def check_folder_fits(root: Path, preset: Preset) -> None:
    """Run the preset's own config check before anything is written.

    Why: a Llama folder pinned with a Gemma 4 preset would otherwise be pinned happily
    and fail only at load time, after the folder was changed. The check comes from the
    model package (``check`` in its preset dict), so pypto-patch still names no family.
    """
    if preset.check is None:
        return
    config, _raw = read_config(root)
    try:
        preset.check(config)
    except ValueError as err:
        detail = " ".join(str(err).split())
        raise PresetMismatchError(
            f"{root / 'config.json'} does not fit preset {preset.family!r}: {detail}"
        ) from None


# --------------------------------------------------------------------------- the plan


def make_plan(
    root: Path, preset: Preset, *, in_place: bool, known_backups: frozenset[str] = frozenset()
) -> Plan:
    """Everything apply will change, computed and checked before anything is written.

    ``known_backups`` are backups an existing manifest records (a re-pin may reuse their
    names); any other ``<name>.pypto_orig`` in the way is refused.
    """
    config, raw_config = read_config(root)
    if preset.custom:
        _check_custom_modules(root, preset)
    _check_dests_nest(sorted(preset.files))
    b = _PlanBuilder(root, preset, in_place=in_place, known_backups=known_backups)
    b.take_out_remote_code()  # 1. files transformers runs without an auto_map entry
    b.place_preset_files()  # 2. the preset's files
    if preset.custom:
        b.record_vouched_modules()  # 3. modules custom mode vouches for
    removed = b.pin_auto_map_files(raw_config)  # 4. every auto_map; config.json last
    return Plan(root, preset, config, b.changes, b.contents, b.created_dirs, removed)


def _check_custom_modules(root: Path, preset: Preset) -> None:
    """Custom mode: every module --auto-map names is copied or already in the folder."""
    present = {p.name[:-3] for p in root.iterdir() if p.name.endswith(".py")}
    placed = {d[:-3] for d in preset.files if d.endswith(".py") and "/" not in d}
    for stem in sorted(auto_map_modules(preset.auto_map)):
        if stem not in placed and stem not in present:
            raise BadInputError(
                f"--auto-map names module {stem!r} but neither --copy places {stem}.py nor does the folder have it"
            )


def _check_dests_nest(dests: list[str]) -> None:
    """No destination is placed as a file while another needs it to be a folder."""
    for d in dests:
        for other in dests:
            if other.startswith(d + "/"):
                raise UnsafePathError(
                    f"{d!r} is placed as a file but {other!r} needs it to be a folder"
                )


@dataclass
class _PlanBuilder:
    """Collects the changes of one plan; each step checks the folder as it goes."""

    root: Path
    preset: Preset
    in_place: bool
    known_backups: frozenset[str]
    contents: dict[str, bytes] = field(default_factory=dict)
    changes: list[FileChange] = field(default_factory=list)
    created_dirs: list[str] = field(default_factory=list)

    def check_parents(self, rel: str, *, creating: bool) -> None:
        """Every parent of ``rel`` is a real folder (or will be created)."""
        cur = self.root
        for part in rel.split("/")[:-1]:
            cur = cur / part
            if cur.is_symlink() and self.in_place:
                raise UnsafePathError(
                    f"{cur} is a symbolic link; changing {rel} through it would change files outside the folder; use --output-dir"
                )
            if os.path.lexists(cur) and not cur.is_dir():
                raise UnsafePathError(f"{cur} is a file, but {rel} needs it to be a folder")
            if creating and not os.path.lexists(cur):
                rc = cur.relative_to(self.root).as_posix()
                if rc not in self.created_dirs:
                    self.created_dirs.append(rc)

    def backup_for(self, rel: str) -> str | None:
        """The backup name for ``rel`` in place (refused if something else is there)."""
        backup = f"{rel}{BACKUP_SUFFIX}"
        if (
            self.in_place
            and backup not in self.known_backups
            and os.path.lexists(self.root / backup)
        ):
            raise BadInputError(
                f"{self.root / backup} already exists but no pypto-patch manifest records it (left by an older patch script?); "
                "move it back over the original or away, then retry"
            )
        return backup if self.in_place else None

    def add(self, rel: str, data: bytes) -> None:
        """Plan ``rel`` to hold ``data``: unchanged, replaced (backed up) or created."""
        path = self.root / rel
        self.contents[rel] = data
        new_sha = sha256_bytes(data)
        if not os.path.lexists(path):
            self.changes.append(FileChange(rel, "created", new_sha, mode=new_file_mode()))
            return
        if path.is_dir() and not path.is_symlink():
            raise UnsafePathError(f"{path} is a folder; a preset file cannot replace it")
        cur, is_link, mode = sha_or_none(path), path.is_symlink(), file_mode(path)
        if cur == new_sha:
            self.changes.append(FileChange(rel, "unchanged", cur, cur, is_link, None, mode))
            return
        backup = self.backup_for(rel)
        self.changes.append(FileChange(rel, "replaced", new_sha, cur, is_link, backup, mode))

    def take_out_remote_code(self) -> None:
        """Files transformers imports without an auto_map entry leave the pinned view."""
        for rel in REMOTE_CODE_FILES:
            path = self.root / rel
            if rel in self.preset.files or not path.is_file():
                continue
            self.check_parents(rel, creating=False)
            backup = self.backup_for(rel)
            self.changes.append(
                FileChange(
                    rel,
                    "removed",
                    None,
                    sha_or_none(path),
                    path.is_symlink(),
                    backup,
                    file_mode(path),
                )
            )

    def place_preset_files(self) -> None:
        for rel in sorted(self.preset.files):
            self.check_parents(rel, creating=True)
            self.add(rel, self.preset.files[rel])

    def record_vouched_modules(self) -> None:
        """Custom mode may name a module the folder already has: the user vouches for it
        (and what it imports relatively), so its bytes are recorded for verify_pinned."""
        files = self.preset.files
        recorded = {c.path for c in self.changes}

        def view(rel: str) -> bytes | None:
            if rel in files:
                return files[rel]
            if "/" in rel or not rel.endswith(".py"):
                return None
            return read_or_none(self.root / rel)

        for stem in sorted(auto_map_modules(self.preset.auto_map)):
            try:
                closure = module_closure(view, f"{stem}.py")
            except BadImport as err:
                raise BadInputError(
                    f"{err}, which transformers would resolve outside the folder; fix that module"
                ) from None
            for rel in closure:
                path = self.root / rel
                if rel in recorded or rel in files or "/" in rel or not path.is_file():
                    continue
                sha = sha_or_none(path)
                self.changes.append(
                    FileChange(rel, "unchanged", sha, sha, path.is_symlink(), None, file_mode(path))
                )
                recorded.add(rel)

    def pin_auto_map_files(self, raw_config: bytes) -> list[dict[str, Any]]:
        """Pin every file transformers reads an auto_map from, config.json (the switch)
        last; returns the removed entries, config.json's first."""
        removed_map: list[dict[str, Any]] = []
        for fname in AUTO_MAP_FILES[1:]:
            path = self.root / fname
            if not path.is_file():
                continue
            doc, _raw = load_json_file(path)
            changed, removed = pin_document(fname, doc, self.preset.auto_map)
            removed_map += removed
            if changed:
                self.add(fname, dumps_config(doc))
        pinned_config = loads_limited(raw_config)  # a fresh copy: the plan's config stays original
        _changed, removed = pin_document("config.json", pinned_config, self.preset.auto_map)
        self.add("config.json", dumps_config(pinned_config))
        return removed + removed_map
