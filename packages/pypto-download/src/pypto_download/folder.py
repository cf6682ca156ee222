"""The output folder: one writer at a time, other tools' state respected, nothing left behind.

- A lock (``flock`` on ``.cache/pypto-download/lock``): two runs into one folder used
  to take each other's partial files ("unexpected FileNotFoundError"); the second now
  stops at once and names the first one's pid. The kernel drops the lock when its
  holder dies, so a killed run never leaves the folder locked.
- pypto-patch's manifest: a folder patched in place holds a pinned ``config.json``
  (and maybe placed modeling files); re-fetching them would silently undo the pin.
- Repo names the pypto tools own are never written from a repo (a forged manifest or
  journal would make pypto-patch act on it).
- After a failure, only what is really on disk is reported as kept, and a folder we
  created is removed if nothing worth resuming is in it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from pypto_common import DOWNLOAD_STATE_DIR, PATCH_MANIFEST, tool_owned_reason
from pypto_common.lock import FileLock, LockHeldError
from pypto_common.lock import make_dirs as common_make_dirs

from .errors import FolderBusyError, OutputPathError

__all__ = [
    "LOCK_RELPATH",
    "FolderLock",
    "PatchState",
    "cleanup_after_failure",
    "escaping_link",
    "files_in",
    "kept_note",
    "make_dirs",
    "patch_state",
    "reserved_reason",
]

logger = logging.getLogger("pypto_download")

LOCK_RELPATH = Path(DOWNLOAD_STATE_DIR) / "lock"
_HUB_STATE = PurePosixPath(".cache") / "huggingface"


# ---------------------------------------------------------------------- names we never write
def reserved_reason(relpath: str) -> str | None:
    """Why a repo file must not be written into the folder, or None.

    The pypto tools' own names (``pypto_common.tool_owned_reason``) and
    huggingface_hub's local-dir state folder (a forged ``.metadata`` there would make
    a half-written file look complete).
    """
    reason = tool_owned_reason(relpath)
    if reason is not None:
        return reason
    path = PurePosixPath(relpath)
    if path == _HUB_STATE or _HUB_STATE in path.parents:
        return f"{relpath!r} is inside huggingface_hub's local-dir state folder {_HUB_STATE}/"
    return None


def escaping_link(out: Path, relpath: str) -> Path | None:
    """The symbolic link inside ``out`` through which ``relpath`` would land outside it."""
    real_out = os.path.realpath(out)
    cur = out
    for part in PurePosixPath(relpath).parts[:-1]:
        cur = cur / part
        if cur.is_symlink():
            target = os.path.realpath(cur)
            if target != real_out and not target.startswith(real_out + os.sep):
                return cur
    return None


# ---------------------------------------------------------------------- pypto-patch's state
@dataclass(frozen=True)
class PatchState:
    """What pypto-patch's manifest in the folder says (``mode``: in-place | overlay)."""

    mode: str | None
    changed: frozenset[str] = field(default_factory=frozenset)
    source: str | None = None
    readable: bool = True


def patch_state(out: Path) -> PatchState | None:
    """None when pypto-patch has not patched the folder."""
    manifest = out / PATCH_MANIFEST
    if not manifest.is_file():
        return None
    try:
        data = json.loads(manifest.read_text())
        files = data.get("files", [])
        changed = frozenset(
            str(f["path"])
            for f in files
            if isinstance(f, dict) and f.get("action") in ("replaced", "created") and f.get("path")
        )
        mode = data.get("mode")
        source = data.get("source_path")
        return PatchState(
            mode=str(mode) if mode else None,
            changed=changed,
            source=str(source) if source else None,
        )
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        # Unreadable: assume the one file every patch changes is pinned.
        return PatchState(mode=None, changed=frozenset({"config.json"}), readable=False)


# ---------------------------------------------------------------------- creating and locking
def make_dirs(out: Path) -> Path | None:
    """Create ``out`` and its missing parents; return the topmost one this call created.

    ``pypto_common.lock.make_dirs`` with pypto-download's errors: only what this call
    really created is ever removed after a failure.
    """
    try:
        return common_make_dirs(out)
    except NotADirectoryError as err:
        raise OutputPathError(f"cannot create {out}: {err.strerror}") from None
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise OutputPathError(
            f"cannot create {out} ({err.strerror}): choose another --output-dir"
        ) from None


class FolderLock:
    """pypto_common's :class:`~pypto_common.lock.FileLock` on ``.cache/pypto-download/lock``.

    Non-blocking and exclusive; the kernel releases it on close or when its holder dies.
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        self.path = out / LOCK_RELPATH
        self._lock = FileLock(self.path)

    def acquire(self) -> None:
        for _ in range(10):
            # The holder before us may remove the folder it created: make it again.
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._lock.acquire()
                return
            except FileNotFoundError:
                continue
            except LockHeldError as err:
                raise FolderBusyError(
                    f"another pypto-download is writing to {self.out} ({err.describe()}); "
                    "wait for it or choose another --output-dir"
                ) from None
        raise FolderBusyError(  # pragma: no cover - the folder kept vanishing under us
            f"another pypto-download is writing to {self.out} (pid unknown); "
            "wait for it or choose another --output-dir"
        )

    def release(self) -> None:
        self._lock.release()


# ---------------------------------------------------------------------- after a failure
def files_in(out: Path) -> set[str]:
    if not out.is_dir():
        return set()
    found = set()
    for p in out.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file():
                found.add(p.relative_to(out).as_posix())
    return found


def kept_note(out: Path, before: set[str]) -> str | None:
    """What a failed run leaves that a re-run uses, as it is on disk now; None if nothing.

    Downloaded files are the new ones outside ``.cache/``; partial files are the
    non-empty ``.incomplete`` ones (huggingface_hub 2.x deletes its own on failure, so
    there often are none, and then none are claimed).
    """
    now = files_in(out)
    downloaded = [r for r in now - before if not r.startswith(".cache/")]
    partial = []
    for rel in now:
        if rel.endswith(".incomplete"):
            with contextlib.suppress(OSError):
                if (out / rel).stat().st_size > 0:
                    partial.append(rel)
    if not downloaded and not partial:
        return None
    parts = []
    if downloaded:
        parts.append(f"{len(downloaded)} downloaded file(s)")
    if partial:
        parts.append(f"{len(partial)} partial file(s)")
    return f"kept in {out}: {' and '.join(parts)}; re-run the same command to fetch the rest"


def cleanup_after_failure(out: Path, created: Path | None, cache_existed: bool, keep: bool) -> None:
    """Leave no empty folder behind: remove what we created if it holds nothing useful.

    A folder that existed before keeps all its content; only a ``.cache`` folder we
    created there goes.
    """
    try:
        if keep:
            return
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        elif not cache_existed:
            shutil.rmtree(out / ".cache", ignore_errors=True)
    except OSError as err:  # cleanup must never hide the real error
        logger.debug("cleanup of %s failed: %s", out, err)
