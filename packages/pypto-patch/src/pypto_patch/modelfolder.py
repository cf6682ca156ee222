"""Reading the model folder the user named: the folder itself, its config.json and the
other JSON files pypto-patch must parse, and whether it may be written.

Everything here only reads; each problem is a one-line error naming the file and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import ConfigError, ModelFolderError, ReadOnlyFolderError
from .jsonio import JSONUnusable, loads_limited

__all__ = [
    "is_writable_dir",
    "load_json_file",
    "read_config",
    "require_writable",
    "resolve_folder",
]


def resolve_folder(model_path: str | os.PathLike[str]) -> Path:
    """``model_path`` resolved; a ModelFolderError when it is missing or not a folder."""
    p = Path(model_path).expanduser()
    if not p.exists():
        raise ModelFolderError(
            f"model folder {os.fspath(model_path)!r} does not exist; check --model-path"
        )
    if not p.is_dir():
        raise ModelFolderError(
            f"{os.fspath(model_path)!r} is not a folder; --model-path must be the folder holding config.json"
        )
    return p.resolve()


def load_json_file(path: Path) -> tuple[Any, bytes]:
    """A JSON file from the model folder; a one-line ConfigError names the file and the fix."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(
            f"{path} is unreadable ({err.strerror or err}); fix its permissions"
        ) from None
    try:
        return loads_limited(raw), raw
    except JSONUnusable as err:
        raise ConfigError(
            f"{path} is {err}; pypto-patch must read it to pin its auto_map: fix or re-download it"
        ) from None


def read_config(root: Path) -> tuple[dict[str, Any], bytes]:
    """config.json as a dict (with its raw bytes); its ``auto_map``, if any, is an object."""
    path = root / "config.json"
    if not path.is_file():
        raise ModelFolderError(
            f"{root} has no config.json; point --model-path at the model folder that holds it"
        )
    data, raw = load_json_file(path)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} holds a JSON {type(data).__name__}, not an object; re-download it"
        )
    am = data.get("auto_map")
    if am is not None and not isinstance(am, dict):
        raise ConfigError(
            f"{path}: 'auto_map' is a {type(am).__name__}, not an object; fix it by hand"
        )
    return data, raw


def is_writable_dir(d: Path) -> bool:
    """Writable for this process and not marked read-only (``a-w``) by the user."""
    # Root ignores permission bits; a folder marked a-w is still treated as read-only
    # because the user said so.
    try:
        st = os.stat(d)
    except OSError:
        return False
    return os.access(d, os.W_OK | os.X_OK) and bool(st.st_mode & 0o222)


def require_writable(d: Path, *, hint: str) -> None:
    """Raise ReadOnlyFolderError (with ``hint`` as the fix) unless ``d`` is writable."""
    if not is_writable_dir(d):
        raise ReadOnlyFolderError(f"{d} is read-only; {hint}")
