"""The work dir: created if needed, proven writable, and held by one run at a time.

Why a lock: ``pypto-e2e run`` resumed after a kill (or simply started twice) ran a second
download, smoke gate and bench beside the first run's still-live processes, both writing
the same manifest and report. A run now holds :class:`pypto_common.lock.FileLock` on
``WORK/pypto-e2e.lock`` from before it reads the manifest until it ends; the kernel
drops the lock when the holder dies however it dies (SIGKILL included), so a killed run
never leaves the work dir locked, and the lock file is removed when a run ends.

Why first: a read-only work dir used to surface as exit 1 from deep inside the first
manifest write. Taking the lock creates a file in the work dir, so a path that cannot
be used fails here, before any step, in one line naming the path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from pypto_common.lock import FileLock, LockHeldError, make_dirs

from .errors import WorkDirBusyError, WorkDirError

__all__ = ["LOCK_NAME", "held_work_dir"]

log = logging.getLogger(__name__)

#: The lock file in the work dir (present only while a run holds it, or after a kill).
LOCK_NAME = "pypto-e2e.lock"


@contextlib.contextmanager
def held_work_dir(work_dir: Path) -> Iterator[Path]:
    """Create ``work_dir`` if needed and hold its lock for the body of the ``with``.

    Raises :class:`WorkDirBusyError` when another live run holds it and
    :class:`WorkDirError` when it cannot be created or written; in both cases nothing
    is left behind (a folder this call created is removed again).
    """
    try:
        created = make_dirs(work_dir)
    except OSError as err:
        raise _unusable(work_dir, err) from None
    lock = FileLock(work_dir / LOCK_NAME, remove_on_release=True)
    try:
        lock.acquire()
    except LockHeldError as err:
        raise WorkDirBusyError(
            f"work dir {work_dir} is in use by another pypto-e2e run ({err.describe()}): "
            "wait for it to end (or stop it) and re-run the same command, or pass another "
            "--work-dir"
        ) from None
    except OSError as err:
        _remove_created(created)
        raise _unusable(work_dir, err) from None
    try:
        yield work_dir
    finally:
        lock.release()


def _unusable(work_dir: Path, err: OSError) -> WorkDirError:
    what = err.strerror or str(err)
    if isinstance(err, NotADirectoryError) and err.filename:
        what = f"{err.filename} is a file, not a folder"
    elif err.filename and str(err.filename) != str(work_dir):
        what = f"{err.filename}: {what}"
    return WorkDirError(
        f"cannot use {work_dir} as the work dir ({what}): make it a writable folder or pass "
        "another --work-dir"
    )


def _remove_created(created: Path | None) -> None:
    if created is not None and os.path.isdir(created):
        shutil.rmtree(created, ignore_errors=True)
        log.debug("removed %s, created by this run before it failed", created)
