"""Hashes and our manifest: what was verified, so a re-run does not hash gigabytes again.

Sizes always; the sha256 of LFS files and the git blob sha1 of the others, i.e. what
the hub lists. A verified file is recorded with its size and mtime; the same size and
mtime later means the same bytes (a tool that rewrites a file changes its mtime).
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from pypto_common import DOWNLOAD_STATE_DIR, atomic_write_text

from .result import RemoteFile

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_RELPATH",
    "Verifier",
    "file_digest",
    "read_manifest",
    "write_manifest",
]

MANIFEST_RELPATH = Path(DOWNLOAD_STATE_DIR) / "manifest.json"
MANIFEST_FORMAT = 1


def file_digest(path: Path, lfs: bool) -> str:
    """sha256 (LFS) or git blob sha1 (others): what the hub lists for the file."""
    size = path.stat().st_size
    h = hashlib.sha256() if lfs else hashlib.sha1(usedforsecurity=False)
    if not lfs:
        h.update(b"blob %d\0" % size)
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(out: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((out / MANIFEST_RELPATH).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == MANIFEST_FORMAT else None


def write_manifest(out: Path, data: dict[str, Any]) -> None:
    """Atomically: a crash mid-write must not leave a manifest a later run trusts."""
    target = out / MANIFEST_RELPATH
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, json.dumps(data, indent=1, sort_keys=True))


class Verifier:
    """Checks files against the listing, remembering what it already hashed."""

    def __init__(self, out: Path, commit: str, previous: dict[str, Any] | None) -> None:
        self.out = out
        self.commit = commit
        self._lock = threading.Lock()
        prev = previous.get("verified", {}) if previous else {}
        self.verified: dict[str, dict[str, Any]] = dict(prev) if isinstance(prev, dict) else {}

    def is_recorded(self, f: RemoteFile, st_size: int, st_mtime_ns: int) -> bool:
        expected = f.sha256 or f.blob_id
        with self._lock:
            rec = self.verified.get(f.path)
        return bool(
            rec
            and rec.get("digest") == expected
            and rec.get("mtime_ns") == st_mtime_ns
            and rec.get("size") == st_size
        )

    def check(self, f: RemoteFile) -> str | None:
        """None if the local file matches; else why not."""
        path = self.out / f.path
        try:
            st = path.stat()
        except FileNotFoundError:
            return "missing"
        if st.st_size != f.size:
            return f"size {st.st_size} != {f.size}"
        expected = f.sha256 or f.blob_id
        if expected is None:
            return None
        if self.is_recorded(f, st.st_size, st.st_mtime_ns):
            return None
        actual = file_digest(path, f.lfs)
        if actual != expected:
            return f"{'sha256' if f.lfs else 'git sha1'} {actual[:12]}.. != {expected[:12]}.."
        with self._lock:
            self.verified[f.path] = {
                "digest": expected,
                "mtime_ns": st.st_mtime_ns,
                "size": st.st_size,
            }
        return None

    def forget(self, path: str) -> None:
        with self._lock:
            self.verified.pop(path, None)
