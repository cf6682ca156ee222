"""One writer per folder: a kernel lock that goes with its holder, and folder creation
that knows what it created.

Why one mechanism: pypto-download found that two runs into one folder took each other's
partial files, and pypto-e2e that a run resumed after a kill started a second set of
processes beside the first one's. Both now hold a :class:`FileLock` for as long as they
write: a non-blocking ``flock`` on an open file whose first line is the holder's pid.
The kernel drops the lock when the last descriptor closes, which happens when the holder
exits however it dies (SIGKILL included), so there is never a stale lock to clean up.

A lock file may be removed while locked (its folder removed after a failure, or the
holder removing it on release): whoever opened the old file re-checks after locking that
the file at the path is the one it locked, and starts again otherwise, so two processes
can never hold "the" lock at once. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from types import TracebackType

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["FileLock", "LockHeldError", "make_dirs"]

#: Retries when the lock file vanishes between opening and locking it.
_ATTEMPTS = 10


class LockHeldError(Exception):
    """Another process holds the lock; ``holder`` is its pid when the file names one.

    ``holder_alive`` is False when that pid is gone, which means a process it started
    (and that inherited the descriptor) still holds the lock.
    """

    def __init__(self, path: Path, holder: int | None) -> None:
        self.path = path
        self.holder = holder
        self.holder_alive = holder is None or _alive(holder)
        super().__init__(f"{path} is locked by {self.describe()}")

    def describe(self) -> str:
        """``pid N`` (or ``pid unknown``), saying so when that pid has exited."""
        if self.holder is None:
            return "pid unknown"
        if not self.holder_alive:
            return f"pid {self.holder}, which has exited; a process it started holds it"
        return f"pid {self.holder}"


class FileLock:
    """A non-blocking exclusive lock on ``path``, released on :meth:`release` or death.

    ``remove_on_release`` unlinks the lock file before unlocking it, so a finished run
    leaves no file behind (safe: see the module docstring). The folder holding ``path``
    must exist; :meth:`acquire` raises :class:`LockHeldError` when another process holds
    the lock and ``OSError`` when the file cannot be opened (a read-only folder...).
    """

    def __init__(self, path: str | os.PathLike[str], *, remove_on_release: bool = False) -> None:
        self.path = Path(path)
        self.remove_on_release = remove_on_release
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already locked by this FileLock")
        if fcntl is None:  # pragma: no cover - not POSIX: no lock
            return
        for _ in range(_ATTEMPTS):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                holder = _read_pid(fd)
                os.close(fd)
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise LockHeldError(self.path, holder) from None
            # The holder before us may have removed the file (or its folder) before
            # unlocking it: lock the file that is really at the path, or another
            # process could lock a second one.
            if not _same_file(self.path, fd):
                os.close(fd)
                continue
            try:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
            except OSError:
                os.close(fd)
                raise
            self._fd = fd
            return
        raise LockHeldError(self.path, None)  # pragma: no cover - the file kept vanishing

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self.remove_on_release and _same_file(self.path, fd):
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.close(fd)  # closing drops the flock

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def make_dirs(path: str | os.PathLike[str]) -> Path | None:
    """Create ``path`` and its missing parents; return the topmost folder this call created.

    Only what this call really created may be removed after a failure: a folder that
    appeared meanwhile (another run's) is not ours. Raises ``NotADirectoryError`` naming
    the part of ``path`` that is a file (or a dangling link), and ``OSError`` unchanged
    for the rest (permission, read-only file system, disk full).
    """
    target = Path(path)
    missing: list[Path] = []
    probe = target
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{probe} is a file, not a folder", str(probe))
    created: Path | None = None
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if not d.is_dir():
                raise NotADirectoryError(
                    errno.ENOTDIR, f"{d} is a file, not a folder", str(d)
                ) from None
            continue
        if created is None:
            created = d
    return created


def _same_file(path: Path, fd: int) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").split("\n", 1)[0].strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and len(text) < 12 else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True
