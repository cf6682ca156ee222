"""What the hub lists and what a call did: the data the library returns and ``--json`` prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DownloadResult", "RemoteFile", "SkippedFile"]


@dataclass(frozen=True)
class RemoteFile:
    """One file of the resolved commit, as the hub lists it."""

    path: str
    size: int
    sha256: str | None  # LFS files only
    blob_id: str | None  # git blob sha1

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256,
            "blob_id": self.blob_id,
        }


@dataclass(frozen=True)
class SkippedFile:
    """A repo file deliberately not written, and why (e.g. a name pypto-patch owns)."""

    path: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass
class DownloadResult:
    """What a call did; ``to_dict()`` is what ``--json`` prints.

    ``endpoint`` is the endpoint as shown (credentials masked): this object is meant
    to be printed and recorded.
    """

    path: Path
    repo_id: str
    revision: str
    commit: str | None
    endpoint: str
    files: list[RemoteFile]
    # path -> complete | partial | missing | patched
    state: dict[str, str] = field(default_factory=dict)
    fetched: list[str] = field(default_factory=list)
    refetched: list[str] = field(default_factory=list)
    dry_run: bool = False
    offline: bool = False
    #: repo files not written because the pypto tools own their names
    skipped: list[SkippedFile] = field(default_factory=list)
    #: files pypto-patch changed in place, kept as they are instead of re-fetched
    patched: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def bytes_to_fetch(self) -> int:
        return sum(
            f.size for f in self.files if self.state.get(f.path) not in ("complete", "patched")
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_path": str(self.path),
            "model_id": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            "endpoint": self.endpoint,
            "dry_run": self.dry_run,
            "offline": self.offline,
            "total_bytes": self.total_bytes,
            "bytes_to_fetch": self.bytes_to_fetch,
            "files": [
                dict(f.to_dict(), state=self.state.get(f.path, "missing")) for f in self.files
            ],
            "fetched": self.fetched,
            "refetched": self.refetched,
            "skipped": [s.to_dict() for s in self.skipped],
            "patched": self.patched,
            "warnings": self.warnings,
        }
