"""Names the pypto tools own inside a model folder.

Why here: pypto-patch writes its bookkeeping into the folder and pypto-download fills
the same folder from a stranger's repo. A repo that ships a file under one of these
names could forge a journal or manifest that pypto-patch would then act on, so
pypto-download refuses them; both read the list from this one place.
"""

from __future__ import annotations

from pathlib import PurePosixPath

__all__ = [
    "DOWNLOAD_STATE_DIR",
    "PATCH_JOURNAL",
    "PATCH_LOCK",
    "PATCH_MANIFEST",
    "PATCH_OVERLAY_MARKER",
    "PATCH_SUFFIXES",
    "RESERVED_NAMES",
    "tool_owned_reason",
]

PATCH_MANIFEST = ".pypto_patch.json"
PATCH_JOURNAL = ".pypto_patch.journal.json"
PATCH_LOCK = ".pypto_patch.lock"
PATCH_OVERLAY_MARKER = ".pypto_patch.overlay.json"
PATCH_SUFFIXES = (".pypto_orig", ".pypto_edited", ".pypto_tmp")
DOWNLOAD_STATE_DIR = ".cache/pypto-download"

#: Exact file names (in any sub-folder) reserved for the tools' own bookkeeping.
RESERVED_NAMES = frozenset({PATCH_MANIFEST, PATCH_JOURNAL, PATCH_LOCK, PATCH_OVERLAY_MARKER})


def tool_owned_reason(relpath: str) -> str | None:
    """Why ``relpath`` (a repo-relative POSIX path) is a name a pypto tool owns, or None."""
    path = PurePosixPath(relpath)
    if path.name in RESERVED_NAMES or path.name.startswith(".pypto_patch"):
        return f"{relpath!r} is a pypto-patch bookkeeping name"
    if path.name.endswith(PATCH_SUFFIXES):
        return f"{relpath!r} ends with a suffix pypto-patch uses for backups"
    state = PurePosixPath(DOWNLOAD_STATE_DIR)
    if path == state or state in path.parents:
        return f"{relpath!r} is inside pypto-download's own state folder {DOWNLOAD_STATE_DIR}/"
    return None
