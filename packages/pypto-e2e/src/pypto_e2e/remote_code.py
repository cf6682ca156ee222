"""The model folder's own code: where it would run, and the pin check before a load.

Used by the patch step (what the repo ships, what the pin removed) and by every load
on the strength of a pin (:meth:`pypto_e2e.state.RunState.trust_for_load`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import EXIT, StepFailedError, cause_of

__all__ = ["entries_text", "remote_code_entries", "verify_pin"]


def remote_code_entries(folder: Path) -> list[dict[str, Any]]:
    """Every way the folder makes transformers import its own code with trust_remote_code.

    ``auto_map`` objects at any depth of the files pypto-patch names
    (``AUTO_MAP_FILES``; processor_config.json nests one per sub-processor),
    ``custom_pipelines`` in config.json, and the files transformers runs without any
    entry (``REMOTE_CODE_FILES``, e.g. ``custom_generate/generate.py``).
    """
    from pypto_patch import AUTO_MAP_FILES, REMOTE_CODE_FILES

    found: list[dict[str, Any]] = []
    for name in AUTO_MAP_FILES:
        try:
            doc = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        stack: list[tuple[Any, str]] = [(doc, "")]
        while stack:  # no recursion: the document comes from a stranger's repo
            node, where = stack.pop()
            if isinstance(node, list):
                stack.extend((v, f"{where}/{i}") for i, v in enumerate(node))
            if not isinstance(node, dict):
                continue
            for key, value in node.items():
                at = f"{where}/{key}" if where else str(key)
                if key == "auto_map" or (name == "config.json" and at == "custom_pipelines"):
                    entries = value.items() if isinstance(value, dict) else [(None, value)]
                    found += [
                        {"file": name, "at": at, "key": str(k), "value": v} for k, v in entries
                    ]
                else:
                    stack.append((value, at))
    for rel in REMOTE_CODE_FILES:
        if (folder / rel).is_file():
            found.append({"file": rel, "at": "", "key": "(runs on load)", "value": None})
    return sorted(found, key=lambda e: (e["file"], e["at"], e["key"]))


def entries_text(entries: list[dict[str, Any]]) -> str:
    return ", ".join(f"{e.get('file')}:{e.get('key')}" for e in entries)


def verify_pin(folder: Path, *, step: str) -> None:
    """pypto-patch's check that every auto_map entry resolves to the preset's shims.

    Run right before anything loads with ``trust_remote_code=True`` on the strength of
    the pin, so only the reviewed shims can run, never code the repo shipped.
    """
    from pypto_patch import PatchError, verify_pinned

    try:
        verify_pinned(folder)
    except PatchError as err:
        raise StepFailedError(
            step,
            f"the pinned folder {folder} failed pypto-patch's verification, so its code is "
            f"not run: {' '.join(str(err).split())}",
            exit_code=EXIT.PATCH_FAILED,
            resume="re-run with --from patch to pin it afresh",
            cause=cause_of("pypto-patch", "pypto_patch", err.exit_code),
        ) from err
