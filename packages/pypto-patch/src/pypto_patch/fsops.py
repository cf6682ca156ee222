"""Small filesystem primitives the patch is built from: atomic writes, backups, a lock.

Every write lands through a temp file and ``os.replace`` so a reader (or a crash) never
sees half a file, and no write ever follows a symbolic link: in a HuggingFace cache
snapshot the files are links into shared blobs, which must never change.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import EXIT, LockedError
from .names import EDITED_SUFFIX, TMP_SUFFIX

__all__ = [
    "FAULT_ENV",
    "FAULT_POINTS",
    "LOCK_TIMEOUT_S",
    "aside_name",
    "atomic_write",
    "dir_lock",
    "fault_point",
    "file_mode",
    "fsync_dir",
    "make_backup",
    "new_file_mode",
    "put_back",
    "read_or_none",
    "same_inode",
    "sha256_bytes",
    "sha256_file",
    "sha_or_none",
    "tmp_path_for",
]

#: How long a run waits for another run's lock on the same folder, by default.
LOCK_TIMEOUT_S = 60.0

#: Test-only fault injection: when this variable names a step (see ``FAULT_POINTS``),
#: the process exits with ``EXIT.FAULT_INJECTED`` right there, like a power cut.
FAULT_ENV = "PYPTO_PATCH_FAULT"

#: Named steps where a test can inject a crash (``PYPTO_PATCH_FAULT=<step>``); the
#: transactions in :mod:`pypto_patch.inplace` and :mod:`pypto_patch.overlay` call
#: :func:`fault_point` with exactly these names.
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


def fault_point(name: str) -> None:
    """Die here if the test harness asked for it; a no-op otherwise."""
    if os.environ.get(FAULT_ENV) == name:
        os._exit(EXIT.FAULT_INJECTED)


def sha256_file(path: Path) -> str:
    """Content hash, following a symlink (what a loader would read)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha_or_none(path: Path) -> str | None:
    """:func:`sha256_file`, or None when the file cannot be read (missing, a folder...)."""
    try:
        return sha256_file(path)
    except OSError:
        return None


def read_or_none(path: Path) -> bytes | None:
    """The bytes of a regular file (through a link), or None when there is none to read."""
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


def same_inode(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are links to one inode (neither followed)."""
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def put_back(backup: Path, path: Path) -> None:
    """Move the backup over ``path``; a no-op pair of hard links is untangled."""
    if same_inode(backup, path):
        os.unlink(backup)  # rename() between two links to one inode does nothing
    else:
        os.replace(backup, path)


def aside_name(path: Path) -> Path:
    """A free ``<name>.pypto_edited[.N]`` next to ``path``, where an edited file is kept."""
    cand = path.parent / f"{path.name}{EDITED_SUFFIX}"
    n = 1
    while os.path.lexists(cand):
        cand = path.parent / f"{path.name}{EDITED_SUFFIX}.{n}"
        n += 1
    return cand


def tmp_path_for(path: Path) -> Path:
    """The one temp name used for ``path``; fixed so recovery can find leftovers."""
    return path.parent / f".{path.name}{TMP_SUFFIX}"


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` (a file or a symlink, never its target) with ``data`` atomically."""
    tmp = tmp_path_for(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def make_backup(path: Path, backup: Path) -> None:
    """Keep ``path`` exactly (bytes, mode, link-ness) under ``backup``.

    A hard link costs nothing on a tens-of-GB folder and is the very same inode, so a
    restore by rename gives back the original bit for bit. Filesystems without hard
    links get a copy (copy2 keeps the mode) or, for a symlink, an identical symlink.
    """
    tmp = tmp_path_for(backup)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        os.link(path, tmp, follow_symlinks=False)
    except OSError as err:
        if err.errno not in (
            errno.EPERM,
            errno.EXDEV,
            errno.EMLINK,
            errno.ENOTSUP,
            errno.EOPNOTSUPP,
        ):
            raise
        if path.is_symlink():
            os.symlink(os.readlink(path), tmp)
        else:
            shutil.copy2(path, tmp, follow_symlinks=False)
    os.replace(tmp, backup)
    fsync_dir(backup.parent)


def file_mode(path: Path, default: int = 0o644) -> int:
    """Permission bits a replacement of ``path`` should carry (the target's, for a link)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return default


def new_file_mode() -> int:
    """0o666 minus the umask: what ``open()`` would have created."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def dir_lock(
    path: Path, *, shared: bool = False, timeout: float = LOCK_TIMEOUT_S
) -> Iterator[None]:
    """flock on the directory itself, so locking leaves no file behind in the model folder.

    Two runs on one folder wait for each other (up to ``timeout`` seconds) instead of
    interleaving their writes; the kernel drops the lock if a run dies.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, flags)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockedError(
                        f"another pypto-patch run is working on {path} (waited {timeout:g}s); retry when it finishes"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the flock
