"""The pinned view: every way transformers imports a folder's code leads to the preset.

``trust_remote_code=True`` is all-or-nothing: once a loader passes it, transformers
imports whatever module *any* ``auto_map`` entry names, in config.json and in the
tokenizer / processor / image, video and audio processor configs (nested per
sub-processor in processor_config.json), ``custom_pipelines`` in config.json, and
``custom_generate/generate.py`` on every model load. Merging the preset's auto_map
into the repo's left the repo's ``AutoTokenizer`` pointing at its own Python, so:

* :func:`pin_document` rewrites one JSON document so that every entry the preset
  covers points at the preset's class and every other entry is removed (and listed);
* :func:`class_refs` / :func:`module_closure` are what :func:`pypto_patch.verify_pinned`
  uses to prove, before a loader enables remote code, that only placed files can run.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any

from .presets import relative_imports

__all__ = [
    "BadImport",
    "auto_map_entries",
    "auto_map_entries_for_pipelines",
    "auto_map_sites",
    "class_refs",
    "module_closure",
    "pin_document",
    "pipeline_refs",
]


def auto_map_sites(doc: Any) -> list[tuple[dict[str, Any], str]]:
    """Every object in ``doc`` holding an ``auto_map`` key, with its JSON location.

    Locations read like ``auto_map`` or ``image_processor/auto_map``; the walk does not
    descend into an auto_map's own value (the whole value is kept or dropped) and uses
    no recursion (the document may come from a hostile repo).
    """
    sites: list[tuple[dict[str, Any], str]] = []
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                loc = f"{where}/{_printable(key)}" if where else _printable(key)
                if key == "auto_map":
                    sites.append((node, loc))
                else:
                    stack.append((value, loc))
        elif isinstance(node, list):
            stack.extend((v, f"{where}/{i}") for i, v in enumerate(node))
    return sorted(sites, key=lambda s: s[1])


def _printable(key: str) -> str:
    """A key from a stranger's file, safe to print on a terminal (escapes, no newlines)."""
    return key if key.isprintable() else json.dumps(key)[1:-1]


def auto_map_entries(value: Any) -> list[tuple[str | None, Any]]:
    """(key, value) pairs of one auto_map as transformers reads it.

    A list is the legacy tokenizer form (``"auto_map": [slow, fast]`` means
    AutoTokenizer); any other non-object has no key (None) and is never kept.
    """
    if isinstance(value, dict):
        return [(k, v) for k, v in value.items()]
    if isinstance(value, list):
        return [("AutoTokenizer", value)]
    return [(None, value)]


def class_refs(value: Any) -> list[Any]:
    """The class references one auto_map value can make transformers import.

    ``"module.Class"``; a ``[slow, fast]`` list (nulls skipped); an image processor's
    ``{backend: ref}`` object. Anything else is returned as-is, to be refused.
    """
    if isinstance(value, list):
        return [v for v in value if v is not None]
    if isinstance(value, dict):
        return [v for v in value.values() if v is not None]
    return [value]


def pin_document(
    fname: str, doc: Any, preset_map: Mapping[str, Any]
) -> tuple[bool, list[dict[str, Any]]]:
    """Rewrite ``doc`` in place for the pinned view; return (changed, removed entries).

    In config.json the top-level auto_map becomes exactly the preset's (it is the
    switch); everywhere else an entry the preset covers is pointed at the preset's
    class and any other entry is removed. ``custom_pipelines`` in config.json is always
    removed (a preset places no pipeline code). Removed entries are
    ``{"file", "at", "key", "value"}``.
    """
    removed: list[dict[str, Any]] = []
    changed = False
    for parent, loc in auto_map_sites(doc):
        old = parent["auto_map"]
        new: dict[str, Any] = {}
        for key, value in auto_map_entries(old):
            if key is not None and key in preset_map:
                new[key] = copy.deepcopy(preset_map[key])
            else:
                removed.append({"file": fname, "at": loc, "key": key, "value": value})
        if fname == "config.json" and parent is doc:
            new = copy.deepcopy(dict(preset_map))
        if new:
            if old != new:
                parent["auto_map"] = new
                changed = True
        else:
            del parent["auto_map"]
            changed = True
    if fname == "config.json" and isinstance(doc, dict):
        if "auto_map" not in doc and preset_map:
            doc["auto_map"] = copy.deepcopy(dict(preset_map))
            changed = True
        pipelines = doc.get("custom_pipelines")
        if pipelines:
            for task, spec in auto_map_entries_for_pipelines(pipelines):
                removed.append(
                    {"file": fname, "at": "custom_pipelines", "key": task, "value": spec}
                )
            del doc["custom_pipelines"]
            changed = True
    return changed, removed


def auto_map_entries_for_pipelines(value: Any) -> list[tuple[str | None, Any]]:
    """(task, spec) pairs of ``custom_pipelines``; a non-object has no task."""
    if isinstance(value, dict):
        return [(k, v) for k, v in value.items()]
    return [(None, value)]


def pipeline_refs(spec: Any) -> list[Any]:
    """The class reference a ``custom_pipelines`` task imports (its ``impl``)."""
    if isinstance(spec, dict):
        return [spec.get("impl")]
    return [spec]


class BadImport(ValueError):
    """A relative import name transformers would turn into a path outside the module's folder."""


def module_closure(read: Callable[[str], bytes | None], module_file: str) -> list[str]:
    """``module_file`` and every file it imports relatively, walked as transformers walks them.

    transformers copies ``<module dir>/<name>.py`` for each ``from .<name> import`` (and
    ``import .<name>``), recursively, and runs them on import. ``read`` returns a file's
    bytes or None when it does not exist (an import of it then fails: no code runs).
    """
    seen: list[str] = []
    todo = [module_file]
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.append(rel)
        data = read(rel)
        if data is None:
            continue
        folder = PurePosixPath(rel).parent
        for name in relative_imports(data):
            if not name or "/" in name or "\\" in name or name.startswith(".") or "\x00" in name:
                raise BadImport(f"{rel} imports {'.' + name!r}")
            todo.append((folder / f"{name}.py").as_posix())
    return seen
