"""The transformers remote-code module cache, keyed exactly as transformers keys it.

``trust_remote_code=True`` copies a local folder's modules into
``$HF_MODULES_CACHE/transformers_modules/<sanitised folder basename>/<hash>/`` where
``<hash>`` is the first 16 hex digits of a sha256 over the module file and the files
it imports relatively (transformers 5.x, ``dynamic_module_utils``). Older releases
copied the files straight into ``<sanitised basename>/``.

Why recompute the key instead of matching names: a purge by substring ("m2", "m3")
deletes other models' cached code. Here an entry is removed only when its key is one
this folder's own code produces, so an unrelated folder that shares the basename but
not the code keeps its entries.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DYNAMIC_MODULE_NAME",
    "CacheKeys",
    "folder_cache_keys",
    "folder_key_names",
    "local_module_hash",
    "modules_cache_dir",
    "purge",
    "sanitize_module_name",
]

log = logging.getLogger(__name__)

DYNAMIC_MODULE_NAME = "transformers_modules"


def modules_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$HF_MODULES_CACHE``, else ``$HF_HOME/modules``, else ``~/.cache/huggingface/modules``.

    Mirrors huggingface_hub's HF_HOME rule (XDG_CACHE_HOME, ``~`` and ``$VARS`` expanded)
    without importing it: pypto-patch stays standard-library only.
    """
    env = os.environ if env is None else env
    if env.get("HF_MODULES_CACHE"):
        return Path(env["HF_MODULES_CACHE"])
    default_home = os.path.join(os.path.expanduser("~"), ".cache")
    hf_home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME", default_home), "huggingface"
    )
    return Path(os.path.expandvars(os.path.expanduser(hf_home))) / "modules"


def sanitize_module_name(name: str) -> str:
    """transformers' folder-name -> package-name rule (``.``->``_dot_``, ``-``->``_hyphen_``)."""
    new = name.replace(".", "_dot_").replace("-", "_hyphen_")
    if new and new[0].isdigit():
        new = f"_{new}"
    return new


def folder_key_names(given: str | os.PathLike[str]) -> list[str]:
    """Package names this folder may be cached under: the basename as given, and as resolved.

    transformers uses ``basename(normpath(path as passed))``, so ``.`` and
    ``/abs/model`` load under different names; both are this folder's.
    """
    given = os.fspath(given)
    names = []
    for candidate in (
        os.path.basename(os.path.normpath(given)),
        os.path.basename(os.path.abspath(given)),
        os.path.basename(os.path.realpath(given)),
    ):
        name = sanitize_module_name(candidate)
        if name and name not in names:
            names.append(name)
    return names


_REL_IMPORT_RES = (
    re.compile(r"^\s*import\s+\.(\S+)\s*$", re.MULTILINE),
    re.compile(r"^\s*from\s+\.(\S+)\s+import", re.MULTILINE),
)


def _relative_imports(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    found: set[str] = set()
    for rx in _REL_IMPORT_RES:
        found.update(rx.findall(text))
    return sorted(found)


def _relative_import_files(module_file: Path) -> list[Path]:
    """Same walk as transformers' get_relative_import_files (module names map to ``<name>.py``)."""
    files_to_check = [module_file]
    collected: list[Path] = []
    while files_to_check:
        new_imports: list[str] = []
        for f in files_to_check:
            new_imports.extend(_relative_imports(f))
        new_files = [module_file.parent / f"{m}.py" for m in new_imports]
        files_to_check = [f for f in new_files if f not in collected]
        collected.extend(files_to_check)
    return collected


def local_module_hash(folder: Path, module_file: str) -> str | None:
    """The 16-hex key transformers gives ``folder/module_file``; None if it cannot be loaded."""
    root = folder.resolve()
    main = root / module_file
    try:
        files = [main, *_relative_import_files(main)]
        entries = []
        for f in files:
            canonical = f.parent.resolve() / f.name
            try:
                rel = canonical.relative_to(root).as_posix()
            except ValueError:
                rel = canonical.as_posix()
            entries.append((rel, f.read_bytes()))
    except (OSError, UnicodeDecodeError):
        return None
    h = hashlib.sha256()
    for rel, data in sorted(entries, key=lambda e: e[0]):
        h.update(rel.encode("utf-8"))
        h.update(data)
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class CacheKeys:
    """What a folder's current code would be cached as (computed before the folder changes)."""

    names: tuple[str, ...]
    hashes: tuple[str, ...]
    # legacy layout: module file name -> its bytes' sha256
    files: tuple[tuple[str, str], ...]


def folder_cache_keys(folder: Path, given: str | os.PathLike[str] | None = None) -> CacheKeys:
    """Keys for every top-level module of ``folder``: any of them may have been loaded."""
    hashes: list[str] = []
    files: list[tuple[str, str]] = []
    try:
        modules = sorted(p.name for p in folder.iterdir() if p.name.endswith(".py") and p.is_file())
    except OSError:
        modules = []
    for name in modules:
        key = local_module_hash(folder, name)
        if key and key not in hashes:
            hashes.append(key)
        try:
            files.append((name, hashlib.sha256((folder / name).read_bytes()).hexdigest()))
        except OSError:
            pass
    names = folder_key_names(given if given is not None else folder)
    return CacheKeys(names=tuple(names), hashes=tuple(hashes), files=tuple(files))


def purge(keys: Iterable[CacheKeys], cache_dir: Path | None = None) -> list[str]:
    """Remove the cache entries these keys name; returns the removed paths."""
    base = (cache_dir if cache_dir is not None else modules_cache_dir()) / DYNAMIC_MODULE_NAME
    removed: list[str] = []
    if not base.is_dir():
        return removed
    for k in keys:
        for name in k.names:
            pkg = base / name
            if not pkg.is_dir() or pkg.is_symlink():
                continue
            for h in k.hashes:
                entry = pkg / h
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(str(entry))
            for fname, digest in k.files:
                legacy = pkg / fname
                try:
                    if (
                        legacy.is_file()
                        and hashlib.sha256(legacy.read_bytes()).hexdigest() == digest
                    ):
                        legacy.unlink()
                        removed.append(str(legacy))
                        for pyc in (pkg / "__pycache__").glob(f"{fname[:-3]}.*.pyc"):
                            pyc.unlink()
                except OSError:
                    continue
    for r in removed:
        log.debug("purged stale remote-code cache entry %s", r)
    return removed
