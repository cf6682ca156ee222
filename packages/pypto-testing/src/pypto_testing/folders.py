"""What a folder holds, byte for byte.

"A refused command changes nothing on disk" is a rule every tool here keeps; tests check
it by comparing this snapshot before and after. One definition, so every package's
tests mean the same thing by "nothing changed".
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["folder_bytes"]


def folder_bytes(folder: str | Path) -> dict[str, bytes]:
    """Every regular file under ``folder`` (recursively), relative path -> its bytes.

    Links are followed as the tools follow them; an added, removed or edited file, or a
    renamed one, changes the result.
    """
    root = Path(folder)
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }
