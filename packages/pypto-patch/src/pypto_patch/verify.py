"""verify_pinned: the check a loader runs before it passes ``trust_remote_code=True``.

Why a separate check: ``apply`` pins a folder once, but the loader runs later, maybe
after someone edited tokenizer_config.json, re-downloaded a file into the folder, or
changed a placed shim. ``trust_remote_code=True`` then runs whatever the folder names.
This re-proves, right before loading, that every way transformers can import code
from the folder leads to a file the manifest recorded, with the bytes it recorded.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import NotPatchedError, NotPinnedError
from .fsops import LOCK_TIMEOUT_S, dir_lock, read_or_none, sha_or_none
from .jsonio import JSONUnusable, loads_limited
from .modelfolder import resolve_folder
from .names import AUTO_MAP_FILES, JOURNAL_NAME, MANIFEST_NAME, REMOTE_CODE_FILES
from .pinning import (
    BadImport,
    auto_map_entries,
    auto_map_entries_for_pipelines,
    auto_map_sites,
    class_refs,
    module_closure,
    pipeline_refs,
)
from .presets import parse_class_ref
from .records import load_journal, load_manifest

__all__ = ["PinVerification", "verify_pinned"]


@dataclass
class PinVerification:
    """Proof that a folder only reaches placed code: what was checked, and against what.

    ``modules`` maps each file transformers may import (the named modules and what they
    import relatively) to the sha256 it has and the manifest recorded.
    """

    model_path: str
    mode: str
    family: str
    preset_version: str
    modules: dict[str, str] = field(default_factory=dict)
    files_checked: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify_pinned(
    model_path: str | os.PathLike[str], *, lock_timeout: float = LOCK_TIMEOUT_S
) -> PinVerification:
    """Prove that loading ``model_path`` with ``trust_remote_code=True`` runs only placed code.

    Checks: the folder holds a manifest pypto-patch wrote for this very folder (no
    interrupted run); every ``auto_map`` entry in every file transformers reads one from,
    every ``custom_pipelines`` impl, and ``custom_generate/generate.py`` resolve to files
    the manifest recorded, whose bytes (and those of every module they import
    relatively) still match the recorded sha256. Never writes.

    Raises :class:`NotPatchedError` (no manifest), :class:`UnsafeBookkeepingError` (a
    manifest or journal not bound to this folder) or :class:`NotPinnedError`; all are
    :class:`PatchError` with a one-line message. Call it right before loading.
    """
    root = resolve_folder(model_path)
    with dir_lock(root, shared=True, timeout=lock_timeout):
        if load_journal(root) is not None:
            raise NotPinnedError(
                f"{root} has an interrupted pypto-patch run ({JOURNAL_NAME}); run "
                f"`pypto-patch restore --model-path {root}` (or apply) before loading it"
            )
        manifest = load_manifest(root)
        if manifest is None:
            raise NotPatchedError(
                f"{root} is not pinned by pypto-patch (no {MANIFEST_NAME}); run pypto-patch apply "
                "first, or load it without trust_remote_code"
            )
        return _verify(root, manifest)


def _verify(root: Path, manifest: dict[str, Any]) -> PinVerification:
    recorded = {f["path"]: f for f in manifest["files"] if f["action"] != "removed"}
    preset = manifest["preset"]
    res = PinVerification(str(root), manifest["mode"], preset["family"], preset["version"])
    fix = "re-run `pypto-patch apply` for this folder, then load it again"

    def read(rel: str) -> bytes | None:
        return read_or_none(root / rel)

    def check_file(module_file: str, why: str) -> None:
        try:
            closure = module_closure(read, module_file)
        except BadImport as err:
            raise NotPinnedError(
                f"{why}: {err}, which the pinned view does not allow; {fix}"
            ) from None
        for rel in closure:
            # Strict even for a file that is missing now: it could appear before the load.
            entry = recorded.get(rel)
            if entry is None:
                raise NotPinnedError(
                    f"{why} makes transformers import {rel}, which pypto-patch did not place "
                    f"(the repo's own code); {fix}"
                )
            sha = sha_or_none(root / rel)
            if sha != entry.get("patched_sha256"):
                raise NotPinnedError(
                    f"{rel} changed since pypto-patch placed it (sha256 {sha} != recorded "
                    f"{entry.get('patched_sha256')}), so it is no longer the reviewed code; {fix}"
                )
            res.modules[rel] = str(sha)

    def check_ref(ref: Any, why: str) -> None:
        parsed = parse_class_ref(ref) if isinstance(ref, str) else None
        if parsed is None or "--" in str(ref):
            raise NotPinnedError(
                f"{why} = {ref!r} is not a class in a module pypto-patch placed "
                f"(another repository, or not 'module.Class'); {fix}"
            )
        check_file(f"{parsed[0]}.py", f"{why} = {ref!r}")

    for fname in AUTO_MAP_FILES:
        path = root / fname
        if not path.is_file():
            continue
        try:
            doc = loads_limited(path.read_bytes())
        except (OSError, JSONUnusable) as err:
            raise NotPinnedError(f"{path} cannot be checked ({err}); {fix}") from None
        res.files_checked.append(fname)
        for parent, loc in auto_map_sites(doc):
            for key, value in auto_map_entries(parent["auto_map"]):
                for ref in class_refs(value):
                    check_ref(ref, f"{fname} {loc}[{key!r}]")
        if fname == "config.json" and isinstance(doc, dict) and doc.get("custom_pipelines"):
            for task, spec in auto_map_entries_for_pipelines(doc["custom_pipelines"]):
                for ref in pipeline_refs(spec):
                    check_ref(ref, f"config.json custom_pipelines[{task!r}].impl")
    for rel in REMOTE_CODE_FILES:
        if (root / rel).is_file():
            res.files_checked.append(rel)
            check_file(rel, f"{rel} (run by from_pretrained with trust_remote_code)")
    return res
