"""One entry point for any dump folder: this package's layout or msprobe's.

Kept apart from both readers so that neither imports the other (msprobe's reader builds on
this package's :class:`~pypto_precision.reader.Dump`).
"""

from __future__ import annotations

from pathlib import Path

from .dump import INDEX
from .errors import BadDumpError
from .msprobe import find_msprobe_dump, read_msprobe
from .reader import Dump, read_index_dump

__all__ = ["read_dump"]


def read_dump(folder: str | Path) -> Dump:
    """The dump in ``folder`` (this package's ``index.json``, or msprobe's: a folder holding
    ``dump.json``, its one ``proc*``, or its one ``step*/proc*``), checked;
    :class:`BadDumpError` with one line otherwise."""
    root = Path(folder)
    if not root.is_dir():
        raise BadDumpError(f"{root}: no such folder: pass a dump folder (pypto-precision dump)")
    if (root / INDEX).exists() or (root / INDEX).is_symlink():
        return read_index_dump(root)
    found = find_msprobe_dump(root)
    if found is not None:
        return read_msprobe(found)
    raise BadDumpError(
        f"{root}: holds no {INDEX} (this tool's dump) and no dump.json (msprobe's): pass a "
        "dump folder"
    )
