"""What a model folder holds, as one digest that changes when any file in it changes.

Why every file: hashing config.json alone let a run reuse its smoke and bench results
after the weights were deleted or swapped. Hashing every byte of a 60 GB checkpoint on
every re-run is not an option either, so each file's digest is the cheapest honest one:

* unchanged since the last run (same size, ``mtime_ns`` and inode as recorded in the
  run manifest): the digest recorded then;
* verified by pypto-download (its manifest's ``verified`` entry matches the file's
  size and ``mtime_ns`` and the listing's sha256 / git blob id): that hub digest, so a
  re-fetched file with the same content keeps its digest;
* small (at most :data:`SMALL_FILE_BYTES`): the sha256 of its content;
* otherwise: its identity (size, ``mtime_ns``, inode), so any rewrite counts as a change.

Tool bookkeeping (``.cache/``, pypto-patch's journal and manifest, ``.git``) is not
model content and is left out; symbolic links are followed (a pypto-patch overlay is
links into the downloaded folder).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pypto_common import DOWNLOAD_STATE_DIR, tool_owned_reason

__all__ = ["SMALL_FILE_BYTES", "FolderFingerprint", "fingerprint_folder", "sha256_file"]

log = logging.getLogger(__name__)

#: Files up to this size are content-hashed when their identity changed.
SMALL_FILE_BYTES = 32 * 1024 * 1024

#: Top-level folders that hold tools' state, not model content.
_SKIPPED_TOP = frozenset({".cache", ".git"})


@dataclass
class FolderFingerprint:
    """A folder's digest plus what it was computed from (for the manifest and messages)."""

    path: str
    digest: str
    files: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """What step inputs record: enough to see a change, small enough to diff."""
        return {"path": self.path, "digest": self.digest, "files": len(self.files)}


def sha256_file(path: Path) -> str | None:
    """The sha256 of a regular file's content; None for anything else or an unreadable file.

    Opened without blocking and checked before reading: a FIFO planted under a model
    file's (or the bench report's) name would otherwise hang the run.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        try:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        except OSError:
            return None
    return h.hexdigest()


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    """``(relpath, path)`` of every model file under ``root``, sorted, links followed once."""
    seen: set[str] = set()

    def visit(folder: Path, rel: str) -> Iterator[tuple[str, Path]]:
        real = os.path.realpath(folder)
        if real in seen:  # a link cycle or two links to one folder: count it once
            return
        seen.add(real)
        try:
            names = sorted(os.listdir(folder))
        except OSError as err:
            log.warning("cannot list %s for the model fingerprint: %s", folder, err)
            return
        for name in names:
            child_rel = f"{rel}/{name}" if rel else name
            if not rel and name in _SKIPPED_TOP:
                continue
            if tool_owned_reason(child_rel) is not None:
                continue
            child = folder / name
            if child.is_dir():
                yield from visit(child, child_rel)
            else:
                yield child_rel, child

    yield from visit(root, "")


def _download_records(root: Path) -> dict[str, dict[str, Any]]:
    """pypto-download's verified hub digests for files of ``root``, keyed by real path."""
    manifest = root / DOWNLOAD_STATE_DIR / "manifest.json"
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    listed = data.get("files")
    verified = data.get("verified")
    if not isinstance(listed, dict) or not isinstance(verified, dict):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for rel, rec in verified.items():
        entry = listed.get(rel)
        if not isinstance(rec, dict) or not isinstance(entry, dict):
            continue
        digest = rec.get("digest")
        # Only a digest the hub listed for this very file counts as its content.
        if not digest or digest not in (entry.get("sha256"), entry.get("blob_id")):
            continue
        real = os.path.realpath(root / rel)
        out[real] = {"digest": digest, "size": rec.get("size"), "mtime_ns": rec.get("mtime_ns")}
    return out


def fingerprint_folder(
    folder: str | os.PathLike[str],
    *,
    cache: dict[str, dict[str, Any]] | None = None,
    previous: Mapping[str, dict[str, Any]] | None = None,
    download_roots: tuple[str | os.PathLike[str], ...] = (),
    small_file_bytes: int = SMALL_FILE_BYTES,
) -> FolderFingerprint:
    """The digest of every model file in ``folder``.

    ``cache`` (real path -> ``{size, mtime_ns, ino, digest}``) is read for the fast
    path and updated in place with every file seen; ``previous`` (the last run's
    cache) is only read, so files that are gone drop out of the new cache.
    ``download_roots`` are folders pypto-download filled (``folder`` itself is always
    tried), whose manifests vouch for their files' content.
    """
    root = Path(folder)
    cache = {} if cache is None else cache
    hub: dict[str, dict[str, Any]] = {}
    for candidate in (root, *(Path(r) for r in download_roots)):
        hub.update(_download_records(candidate))
    files: dict[str, str] = {}
    for rel, path in _walk(root):
        files[rel] = _file_digest(path, cache, previous or {}, hub, small_file_bytes)
    blob = json.dumps(files, sort_keys=True).encode()
    digest = hashlib.sha256(blob).hexdigest()[:24]
    return FolderFingerprint(path=str(root), digest=digest, files=files)


def _file_digest(
    path: Path,
    cache: dict[str, dict[str, Any]],
    previous: Mapping[str, dict[str, Any]],
    hub: Mapping[str, dict[str, Any]],
    small_file_bytes: int,
) -> str:
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return "missing"  # a dangling link: a change like any other
    ident = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}
    for known in (cache.get(real), previous.get(real)):
        if known and all(known.get(k) == v for k, v in ident.items()):
            cache[real] = known
            return str(known["digest"])
    record = hub.get(real)
    if record and record["size"] == st.st_size and record["mtime_ns"] == st.st_mtime_ns:
        digest = f"hub:{record['digest']}"
    elif not stat.S_ISREG(st.st_mode):
        return "not-a-file"  # a FIFO, socket or device: never read
    elif st.st_size <= small_file_bytes:
        content = sha256_file(Path(real))
        if content is None:
            return "unreadable"
        digest = f"sha256:{content}"
    else:
        digest = f"stat:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
    cache[real] = {**ident, "digest": digest}
    return digest
