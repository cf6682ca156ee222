"""The names pypto-patch owns come from pypto_common, and its exit codes from one table."""

from __future__ import annotations

import pytest

import pypto_common
import pypto_patch as pp
from pypto_patch.names import EDITED_SUFFIX, TMP_SUFFIX
from pypto_patch.presets import normalize_dest


def test_bookkeeping_names_are_pypto_commons():
    assert pp.MANIFEST_NAME == pypto_common.PATCH_MANIFEST
    assert pp.JOURNAL_NAME == pypto_common.PATCH_JOURNAL
    assert pp.OVERLAY_MARKER_NAME == pypto_common.PATCH_OVERLAY_MARKER
    assert (pp.BACKUP_SUFFIX, EDITED_SUFFIX, TMP_SUFFIX) == (
        ".pypto_orig",
        ".pypto_edited",
        ".pypto_tmp",
    )
    assert set(pypto_common.PATCH_SUFFIXES) == {pp.BACKUP_SUFFIX, EDITED_SUFFIX, TMP_SUFFIX}


@pytest.mark.parametrize(
    "dest",
    [
        ".pypto_patch.json",
        "sub/.pypto_patch.journal.json",
        ".pypto_patch.overlay.json",
        ".pypto_patch.lock",
        "x.py.pypto_edited",
        ".cache/pypto-download/state.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
    ],
)
def test_no_preset_may_place_a_name_the_tools_own(dest):
    with pytest.raises(pp.UnsafePathError, match="manages itself"):
        normalize_dest(dest)


def test_exit_codes_are_declared_once_in_the_tools_range():
    assert pp.EXIT.tool == "pypto-patch"
    own = [e for e in pp.EXIT if e.code >= 10]
    assert own
    assert all(e.code in pypto_common.EXIT_RANGES["pypto-patch"] for e in own)
    for name in (
        "NOT_PATCHED",
        "MODIFIED",
        "LOCKED",
        "PRESET_INVALID",
        "UNKNOWN_FAMILY",
        "UNSAFE_BOOKKEEPING",
        "OVERLAY_REFUSED",
        "NOT_PINNED",
        "FAULT_INJECTED",
    ):
        assert getattr(pp.EXIT, name) in pp.EXIT
    errors = [
        pp.NotPatchedError,
        pp.ModifiedSincePatchError,
        pp.LockedError,
        pp.PresetInvalidError,
        pp.UnknownFamilyError,
        pp.UnsafeBookkeepingError,
        pp.OverlayRefusedError,
        pp.NotPinnedError,
    ]
    codes = [e.exit_code for e in errors]
    assert len(set(codes)) == len(codes)  # callers can tell every failure apart
