"""Presets: what a model family's patch writes, discovered from installed packages.

A model package registers a preset under the entry-point group ``pypto.model_families``
(see the README for the dict format). pypto-patch names no family itself: installing
``pypto-models-<family>`` is what makes ``--model-family <family>`` available.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import PurePosixPath
from typing import Any

from pypto_common import tool_owned_reason

from .errors import (
    BadInputError,
    PatchError,
    PresetInvalidError,
    UnknownFamilyError,
    UnsafePathError,
)
from .names import (
    AUTO_MAP_FILES,
    BACKUP_SUFFIX,
    EDITED_SUFFIX,
    JOURNAL_NAME,
    MANIFEST_NAME,
    OVERLAY_MARKER_NAME,
    TMP_SUFFIX,
)

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "pypto.model_families"

# Re-exported public names (they live in .names, sourced from pypto_common).
__all__ = [
    "BACKUP_SUFFIX",
    "EDITED_SUFFIX",
    "ENTRY_POINT_GROUP",
    "JOURNAL_NAME",
    "MANIFEST_NAME",
    "OVERLAY_MARKER_NAME",
    "TMP_SUFFIX",
    "Preset",
    "auto_map_modules",
    "custom_preset",
    "discover_presets",
    "get_preset",
    "list_presets",
    "normalize_dest",
    "parse_class_ref",
    "relative_imports",
]

_FAMILY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# transformers splits a class reference on exactly one dot: "<module file stem>.<Class>".
_CLASS_REF_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)$")
_KNOWN_KEYS = {"family", "version", "description", "auto_map", "files", "check"}
# Loading classes a multimodal preset tends to map alone; a causal-LM load would then
# silently fall back to the folder's own (remote or native) class.
_MULTIMODAL_KEYS = {"AutoModelForImageTextToText", "AutoModelForVision2Seq"}


def normalize_dest(dest: str, *, what: str = "destination") -> str:
    """Return ``dest`` as a clean relative POSIX path inside the folder, or raise.

    Why strict: a destination is joined onto a folder of tens of GB the user cannot
    download again, so anything that could land outside it (``..``, absolute paths,
    drive letters, backslashes) or on a file pypto-patch owns is refused up front.
    """
    if not isinstance(dest, str) or not dest or "\x00" in dest:
        raise UnsafePathError(f"{what} {dest!r} is empty or not a string")
    if "\\" in dest or dest.startswith("/") or re.match(r"^[A-Za-z]:", dest):
        raise UnsafePathError(
            f"{what} {dest!r} is absolute; give a path relative to the model folder"
        )
    parts = PurePosixPath(dest).parts
    if (
        any(p in ("..", ".") for p in dest.split("/"))
        or not parts
        or any(not p for p in dest.split("/"))
    ):
        raise UnsafePathError(
            f"{what} {dest!r} escapes or is not a plain path inside the model folder; use a relative path like 'sub/file.py'"
        )
    norm = "/".join(parts)
    if norm in AUTO_MAP_FILES or tool_owned_reason(norm) is not None:
        raise UnsafePathError(
            f"{what} {dest!r} is a file pypto-patch manages itself "
            f"({', '.join(AUTO_MAP_FILES)} change only through auto_map)"
        )
    return norm


def parse_class_ref(value: str) -> tuple[str, str] | None:
    """Split ``"modeling_x.Class"`` into (module stem, class); None if it is not that shape."""
    m = _CLASS_REF_RE.match(value) if isinstance(value, str) else None
    return (m.group(1), m.group(2)) if m else None


_REL_IMPORT_RES = (
    re.compile(r"^\s*import\s+\.(\S+)\s*$", re.MULTILINE),
    re.compile(r"^\s*from\s+\.(\S+)\s+import", re.MULTILINE),
)


def relative_imports(source: bytes | str) -> list[str]:
    """Module names a file imports relatively, found the way transformers finds them.

    transformers copies (and so runs) every such module from the model folder along
    with the one auto_map names; a shim importing ``.helper`` would run the repo's
    ``helper.py`` unless the preset places it too.
    """
    text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    found: set[str] = set()
    for rx in _REL_IMPORT_RES:
        found.update(rx.findall(text))
    return sorted(found)


def auto_map_modules(auto_map: Mapping[str, Any]) -> set[str]:
    """Module stems an ``auto_map`` makes transformers import from the folder.

    Values are "module.Class" or, for tokenizers, a [slow, fast] list with nulls;
    references into another repo ("repo--module.Class") are not local and skipped.
    """
    stems: set[str] = set()
    for value in auto_map.values():
        refs = value if isinstance(value, list) else [value]
        for ref in refs:
            if isinstance(ref, str) and "--" not in ref:
                parsed = parse_class_ref(ref)
                if parsed:
                    stems.add(parsed[0])
    return stems


@dataclass(frozen=True)
class Preset:
    """A validated patch recipe: the auto_map to merge and the files to place.

    ``files`` maps a destination (relative to the model folder) to its exact bytes.
    ``distribution`` names the installed package it came from (None when built in code).
    """

    family: str
    version: str
    auto_map: Mapping[str, Any]
    files: Mapping[str, bytes]
    description: str = ""
    distribution: str | None = None
    distribution_version: str | None = None
    custom: bool = field(default=False, compare=False)
    #: Optional ``check(config_dict)`` from the model package: raises ``ValueError`` (one
    #: line) when a folder's config.json does not fit this preset; run before any write.
    check: Callable[[Mapping[str, Any]], None] | None = field(default=None, compare=False)

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        origin: str = "preset passed in code",
        expected_family: str | None = None,
        distribution: str | None = None,
        distribution_version: str | None = None,
    ) -> Preset:
        """Validate a contract-A dict (see README) and build a Preset; one-line errors name ``origin``."""
        return _validate(
            data,
            origin=origin,
            expected_family=expected_family,
            distribution=distribution,
            distribution_version=distribution_version,
        )

    @property
    def fingerprint(self) -> str:
        """Identity of what this preset writes: same fingerprint, same patch (re-apply is a no-op)."""
        doc = {
            "family": self.family,
            "version": self.version,
            "auto_map": self.auto_map,
            "files": {k: hashlib.sha256(v).hexdigest() for k, v in sorted(self.files.items())},
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def to_summary(self) -> dict[str, Any]:
        """JSON-able description (no file contents) for ``list``/``status``/manifests."""
        return {
            "family": self.family,
            "version": self.version,
            "description": self.description,
            "distribution": self.distribution,
            "distribution_version": self.distribution_version,
            "auto_map": dict(self.auto_map),
            "files": sorted(self.files),
            "custom": self.custom,
        }


def _fail(origin: str, problem: str, *, custom: bool = False) -> PatchError:
    if custom:
        return BadInputError(f"{origin}: {problem}")
    return PresetInvalidError(
        f"invalid pypto-patch preset from {origin}: {problem} (fix or update that package)"
    )


def _validate(
    data: Any,
    *,
    origin: str,
    expected_family: str | None,
    distribution: str | None,
    distribution_version: str | None,
    custom: bool = False,
) -> Preset:
    if not isinstance(data, Mapping):
        raise _fail(
            origin, f"expected a dict (or a callable returning one), got {type(data).__name__}"
        )
    family, version, description = _validate_header(
        data, origin=origin, expected_family=expected_family, custom=custom
    )
    clean_map = _validate_auto_map(data.get("auto_map"), origin=origin, custom=custom)
    if not custom:
        _check_map_complete(clean_map, origin=origin)
    clean_files = _validate_files(data.get("files", {}), origin=origin, custom=custom)
    if not custom:
        _check_files_complete(clean_map, clean_files, origin=origin)
    check = data.get("check")
    if check is not None and not callable(check):
        raise _fail(
            origin,
            f"'check' must be a callable taking config.json as a dict, got {check!r}",
            custom=custom,
        )
    return Preset(
        family=family,
        version=version,
        auto_map=clean_map,
        files=clean_files,
        description=description,
        distribution=distribution,
        distribution_version=distribution_version,
        custom=custom,
        check=check,
    )


def _validate_header(
    data: Mapping[str, Any], *, origin: str, expected_family: str | None, custom: bool
) -> tuple[str, str, str]:
    """The keys, ``family``, ``version`` and ``description`` of a preset dict."""
    unknown = sorted(set(data) - _KNOWN_KEYS)
    if unknown:
        raise _fail(
            origin, f"unknown keys {unknown}; allowed: {sorted(_KNOWN_KEYS)}", custom=custom
        )
    missing = sorted({"family", "version", "auto_map", "files"} - set(data))
    if missing and not custom:
        raise _fail(origin, f"missing keys {missing}", custom=custom)
    family = data.get("family")
    if not isinstance(family, str) or not _FAMILY_RE.match(family):
        raise _fail(
            origin, f"'family' must be a name like 'gemma4_31b_it', got {family!r}", custom=custom
        )
    if expected_family is not None and family != expected_family:
        raise _fail(
            origin,
            f"'family' is {family!r} but the entry point is named {expected_family!r}; they must match",
        )
    version = data.get("version")
    if not isinstance(version, str) or not version.strip():
        raise _fail(origin, f"'version' must be a non-empty string, got {version!r}", custom=custom)
    description = data.get("description", "")
    if not isinstance(description, str):
        raise _fail(origin, "'description' must be a string", custom=custom)
    return family, version, description


def _validate_auto_map(auto_map: Any, *, origin: str, custom: bool) -> dict[str, Any]:
    """``auto_map``: Auto class names -> ``module.Class`` (or ``[slow, fast]``), copied."""
    if not isinstance(auto_map, Mapping) or (not auto_map and not custom):
        raise _fail(
            origin,
            "'auto_map' must be a non-empty dict of Auto class -> 'module.Class'",
            custom=custom,
        )
    clean_map: dict[str, Any] = {}
    for key, value in auto_map.items():
        if not isinstance(key, str) or not re.match(r"^Auto[A-Za-z0-9]+$", key):
            raise _fail(
                origin,
                f"auto_map key {key!r} is not an Auto class name like 'AutoModelForCausalLM'",
            )
        refs = value if isinstance(value, list) else [value]
        if isinstance(value, list) and (len(value) != 2 or all(r is None for r in value)):
            raise _fail(
                origin, f"auto_map[{key!r}] list must be [slow, fast] with at least one class"
            )
        for ref in refs:
            if ref is None and isinstance(value, list):
                continue
            if isinstance(ref, str) and "--" in ref:
                raise _fail(
                    origin,
                    f"auto_map[{key!r}] = {ref!r} points at code in another repository; presets must place their code",
                )
            if parse_class_ref(ref) is None:
                raise _fail(
                    origin, f"auto_map[{key!r}] = {ref!r} is not 'module_file_stem.ClassName'"
                )
        clean_map[key] = list(value) if isinstance(value, list) else value
    return clean_map


def _validate_files(files: Any, *, origin: str, custom: bool) -> dict[str, bytes]:
    """``files``: safe destinations -> file bytes (text accepted)."""
    if not isinstance(files, Mapping) or (not files and not custom):
        raise _fail(
            origin,
            "'files' must be a non-empty dict of destination -> file text",
            custom=custom,
        )
    clean_files: dict[str, bytes] = {}
    for dest, content in files.items():
        try:
            norm = normalize_dest(dest, what="file destination")
        except UnsafePathError as err:
            if custom:
                raise
            raise _fail(origin, str(err), custom=custom) from None
        if isinstance(content, str):
            content = content.encode("utf-8")
        if not isinstance(content, bytes):
            raise _fail(
                origin,
                f"files[{dest!r}] must be the file's text (str), got {type(content).__name__}",
            )
        if norm in clean_files:
            raise _fail(origin, f"files lists {norm!r} twice", custom=custom)
        clean_files[norm] = content
    return clean_files


def _check_map_complete(clean_map: Mapping[str, Any], *, origin: str) -> None:
    """A registered preset (not custom mode) maps the classes a load needs."""
    if "AutoConfig" not in clean_map:
        raise _fail(
            origin,
            "auto_map must map 'AutoConfig' (the model classes' config_class comes from it)",
        )
    if not any(k.startswith("AutoModel") for k in clean_map):
        raise _fail(origin, "auto_map must map at least one AutoModel* class")
    if _MULTIMODAL_KEYS & set(clean_map) and "AutoModelForCausalLM" not in clean_map:
        raise _fail(
            origin,
            "auto_map maps an image-text Auto class but not 'AutoModelForCausalLM'; a causal-LM load would ignore the preset",
        )


def _check_files_complete(
    clean_map: Mapping[str, Any], clean_files: Mapping[str, bytes], *, origin: str
) -> None:
    """A registered preset places every module its auto_map names, and every module its
    placed top-level modules import relatively."""
    placed = {d[:-3] for d in clean_files if d.endswith(".py") and "/" not in d}
    for stem in sorted(auto_map_modules(clean_map)):
        if stem not in placed:
            raise _fail(
                origin,
                f"auto_map names module {stem!r} but 'files' does not place '{stem}.py' at the folder top level",
            )
    for dest, content in sorted(clean_files.items()):
        if not dest.endswith(".py") or "/" in dest:
            continue
        for mod in relative_imports(content):
            if mod not in placed:
                raise _fail(
                    origin,
                    f"{dest} imports '.{mod}' but 'files' does not place '{mod}.py'; "
                    "transformers would run the model folder's own copy of it",
                )


def custom_preset(
    auto_map: Mapping[str, Any], files: Mapping[str, bytes], *, name: str = "custom"
) -> Preset:
    """A preset built from --auto-map/--copy flags; looser rules (it may map only some classes)."""
    return _validate(
        {"family": name, "version": "custom", "auto_map": dict(auto_map), "files": dict(files)},
        origin="custom mode (--auto-map/--copy)",
        expected_family=None,
        distribution=None,
        distribution_version=None,
        custom=True,
    )


@dataclass(frozen=True)
class Discovery:
    """Result of scanning installed packages: valid presets and per-family problems."""

    presets: dict[str, Preset]
    errors: dict[str, str]


def discover_presets(only: str | None = None) -> Discovery:
    """Load every ``pypto.model_families`` entry point; a broken one never hides the others.

    ``only`` loads just the entry points of that family name: a model package may import
    torch at import time, and ``apply --model-family X`` should not pay for all of them.
    """
    presets: dict[str, Preset] = {}
    errors: dict[str, str] = {}
    seen: dict[str, tuple[str, str]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if only is not None and ep.name != only:
            continue
        dist = getattr(ep, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else None
        dist_version = dist.version if dist is not None else None
        ident = (ep.value, dist_name or "?")
        if ep.name in seen:
            if seen[ep.name] == ident:
                continue  # the same distribution found twice on sys.path
            errors[ep.name] = str(
                PresetInvalidError(
                    f"family {ep.name!r} is registered by two packages ({seen[ep.name][1]} and {ident[1]}); uninstall one"
                )
            )
            presets.pop(ep.name, None)
            continue
        seen[ep.name] = ident
        origin = f"package {dist_name or '?'} (entry point {ep.name} = {ep.value})"
        try:
            obj: Any = ep.load()
            if callable(obj) and not isinstance(obj, Mapping):
                obj = obj()
            presets[ep.name] = _validate(
                obj,
                origin=origin,
                expected_family=ep.name,
                distribution=dist_name,
                distribution_version=dist_version,
            )
        except PresetInvalidError as err:
            errors[ep.name] = str(err)
        except Exception as err:  # a model package failing to import must not break `list`
            errors[ep.name] = str(_fail(origin, f"loading it raised {type(err).__name__}: {err}"))
    for msg in errors.values():
        log.warning("%s", msg)
    return Discovery(presets=presets, errors=errors)


def list_presets() -> list[Preset]:
    """Valid installed presets, sorted by family name."""
    found = discover_presets().presets
    return [found[k] for k in sorted(found)]


def get_preset(family: str) -> Preset:
    """The installed preset for ``family``; typed errors list what is installed."""
    found = discover_presets(only=family)
    if family in found.errors:
        raise PresetInvalidError(found.errors[family])
    if family not in found.presets:
        names = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
        known = ", ".join(sorted(names)) or "none installed"
        raise UnknownFamilyError(
            f"unknown model family {family!r} (known: {known}); install the package pypto-models-<family> that provides it"
        )
    return found.presets[family]


PresetFactory = Callable[[], Mapping[str, Any]]
