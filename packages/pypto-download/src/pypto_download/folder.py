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

from .errors import FolderBusyError, OutputPathError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

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

    Only what this call really created is ever removed after a failure: a folder that
    appeared meanwhile (another run) is not ours.
    """
    missing: list[Path] = []
    probe = out
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    created: Path | None = None
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if not d.is_dir():
                raise OutputPathError(f"cannot create {out}: {d} is a file, not a folder") from None
            continue
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise OutputPathError(
                f"cannot create {out} ({err.strerror}): choose another --output-dir"
            ) from None
        if created is None:
            created = d
    return created


class FolderLock:
    """A non-blocking exclusive lock on the output folder, released on close or death."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.path = out / LOCK_RELPATH
        self._fd: int | None = None

    def acquire(self) -> None:
        if fcntl is None:  # pragma: no cover - not POSIX: no lock, as before
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                holder = _read_pid(fd)
                os.close(fd)
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise FolderBusyError(
                    f"another pypto-download is writing to {self.out} (pid {holder}); "
                    "wait for it or choose another --output-dir"
                ) from None
            # The holder before us may have removed the folder it created: lock the file
            # that is really at the path, or another run could lock a second one.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                self.path.parent.mkdir(parents=True, exist_ok=True)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self._fd = fd
            return
        raise FolderBusyError(  # pragma: no cover - the folder kept vanishing under us
            f"another pypto-download is writing to {self.out} (pid unknown); "
            "wait for it or choose another --output-dir"
        )

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


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
