"""What is already in the folder, and continuing what a killed run left half-done.

huggingface_hub >= 1.x writes each download to a per-process
``<hash>.<etag>.<8 hex>.incomplete`` and never reads another process's file again, so a
killed run's partial bytes would be fetched anew; 0.x uses ``<hash>.<etag>.incomplete``
and resumes it itself. We continue a killed run's partial LFS file with a Range request
through the library's own ``http_get`` before handing the file back to
``hf_hub_download`` (which then only records its metadata).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path

from .integrity import Verifier
from .result import RemoteFile

__all__ = ["HUB_META_DIR", "continue_partial", "leftover_partial", "local_state"]

logger = logging.getLogger("pypto_download")

HUB_META_DIR = Path(".cache") / "huggingface"
_UNIQUE_PARTIAL = re.compile(r"\.[0-9a-f]{8}\.incomplete$")


def local_state(out: Path, f: RemoteFile, verifier: Verifier, commit: str) -> str:
    """complete | partial | missing, from our manifest or the hub library's metadata."""
    path = out / f.path
    with contextlib.suppress(OSError, IndexError):
        st = path.stat()
        if path.is_file() and st.st_size == f.size:
            if verifier.is_recorded(f, st.st_size, st.st_mtime_ns):
                return "complete"
            meta = out / HUB_META_DIR / "download" / f"{f.path}.metadata"
            if meta.read_text().splitlines()[0].strip() == commit:
                return "complete"
    partial_dir = (out / HUB_META_DIR / "download" / f.path).parent
    with contextlib.suppress(OSError):
        if partial_dir.is_dir() and any(
            p.name.endswith(".incomplete") and p.stat().st_size > 0
            for p in partial_dir.iterdir()
            if p.is_file()
        ):
            return "partial"
    return "missing"


def leftover_partial(out: Path, f: RemoteFile) -> Path | None:
    """The largest partial file a killed huggingface_hub >= 1.x run left for ``f``."""
    etag = f.sha256 or f.blob_id
    partial_dir = (out / HUB_META_DIR / "download" / f.path).parent
    if not etag or not partial_dir.is_dir():
        return None
    found = [
        p
        for p in partial_dir.iterdir()
        if p.is_file() and f".{etag}." in p.name and _UNIQUE_PARTIAL.search(p.name)
    ]
    if not found:
        return None
    found.sort(key=lambda p: p.stat().st_size)
    for stale in found[:-1]:
        with contextlib.suppress(OSError):
            stale.unlink()
    best = found[-1]
    if not 0 < best.stat().st_size <= f.size:
        with contextlib.suppress(OSError):
            best.unlink()
        return None
    return best


def continue_partial(
    partial: Path,
    out: Path,
    f: RemoteFile,
    *,
    repo_id: str,
    commit: str,
    endpoint: str,
    token: str | None,
) -> None:
    """Fetch the rest of ``partial`` with a Range request and move it into place.

    huggingface_hub's own ``http_get`` does the transfer (it speaks Range, retries and
    follows the hub's redirects the same way a normal download does); the hub then sees
    a complete file whose sha256 equals its etag and only records its metadata.
    """
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    done = partial.stat().st_size
    url = hf_hub_url(repo_id, f.path, revision=commit, endpoint=endpoint)
    with open(partial, "r+b") as fh:  # not "ab": a 200 answer makes http_get seek back to 0
        fh.seek(done)
        http_get(
            url, fh, resume_size=done, headers=build_hf_headers(token=token), expected_size=f.size
        )
    if partial.stat().st_size != f.size:
        partial.unlink()
        return
    dest = out / f.path
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, dest)
    logger.info("resumed %s from byte %d of a previous run", f.path, done)
