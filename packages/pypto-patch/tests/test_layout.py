"""Where the code lives (README "Where does X live"): the names once defined in
``pypto_patch.core`` still import from there, and are the very objects of their new homes."""

from __future__ import annotations

from pathlib import Path

import pypto_patch
from pypto_patch import core, fsops, inplace, overlay, plan, records, results


def test_core_keeps_its_old_names():
    assert core.FileChange is results.FileChange
    assert core.PatchResult is results.PatchResult
    assert core.RestoreResult is results.RestoreResult
    assert core.StatusResult is results.StatusResult
    assert core.read_manifest is records.read_manifest
    assert core.MANIFEST_SCHEMA_VERSION == records.MANIFEST_SCHEMA_VERSION == 2
    assert core.FAULT_POINTS is fsops.FAULT_POINTS
    assert core.LOCK_TIMEOUT_S == fsops.LOCK_TIMEOUT_S == 60.0
    for name in ("apply", "status", "restore"):
        assert getattr(pypto_patch, name) is getattr(core, name)


def test_each_crash_point_is_named_by_its_transaction():
    """apply:* and restore:* are steps of the in-place transaction, overlay:* of the
    overlay build; each is named exactly once, in the module that owns it."""
    sources = {
        m.__name__: Path(m.__file__).read_text()
        for m in (core, fsops, inplace, overlay, plan, records, results)
    }
    owner = {"apply": "pypto_patch.inplace", "restore": "pypto_patch.inplace"}
    owner["overlay"] = "pypto_patch.overlay"
    for point in fsops.FAULT_POINTS:
        calls = {
            name: text.count(f'fault_point("{point}")')
            for name, text in sources.items()
            if f'fault_point("{point}")' in text
        }
        assert calls == {owner[point.split(":")[0]]: 1}, point
