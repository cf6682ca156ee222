"""What apply, restore and status return: plain dataclasses with ``to_dict()`` for ``--json``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["FileChange", "PatchResult", "RestoreResult", "StatusResult"]


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
