"""Bookkeeping found in a model folder is untrusted: a hub repo can ship a forged journal or
manifest (pypto-download copies dotfiles), and a patched folder can be copied elsewhere.
None of it may steer a rename or unlink outside the folder, or at all unless it is bound
to this very folder; the folder and everything outside it stay byte for byte unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

import pypto_patch as pp
from pypto_patch import JOURNAL_NAME, MANIFEST_NAME, UnsafeBookkeepingError

VICTIM_TEXT = b"the user's precious file outside the model folder\n"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _identity(folder: Path) -> dict:
    """What an attacker would have to guess: the folder's real path and inode."""
    st = os.stat(folder)
    return {"path": str(folder.resolve()), "dev": st.st_dev, "ino": st.st_ino}


@pytest.fixture
def hostile(tmp_path: Path, make_folder):
    """A model folder, a victim file outside it, and a link in the folder pointing outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_bytes(VICTIM_TEXT)
    folder = make_folder(tmp_path / "models" / "m")
    os.symlink(outside, folder / "linked")
    # What a repo would ship as the "backup" to move over the victim.
    (folder / "payload.pypto_orig").write_bytes(b"pwned\n")
    return tmp_path, folder, victim


def _target(case: str, victim: Path) -> str:
    return {
        "absolute": str(victim),
        "dotdot": "../../outside/victim.txt",
        "symlink": "linked/victim.txt",
    }[case]


def _journal(folder: Path, victim: Path, case: str, action: str, *, bound: bool) -> dict:
    entry = {
        "path": _target(case, victim),
        "action": action,
        "patched_sha256": _sha(VICTIM_TEXT),  # matches the victim, so a rollback "owns" it
        "original_sha256": _sha(b"pwned\n"),
        "original_is_symlink": False,
        "backup": "payload.pypto_orig" if action == "replaced" else None,
        "mode": 0o644,
    }
    doc = {
        "tool": "pypto-patch",
        "op": "apply",
        "transaction": "a" * 32,
        "files": [entry],
        "created_dirs": [],
    }
    if bound:
        doc["folder"] = _identity(folder)
    return doc


def _manifest(folder: Path, victim: Path, case: str, *, bound: bool) -> dict:
    doc = {
        "schema_version": 2,
        "tool": "pypto-patch",
        "tool_version": pp.__version__,
        "created_at": "2026-11-29T23:04:05Z",
        "transaction": "b" * 32,
        "mode": "in-place",
        "source_path": str(folder),
        "preset": {
            "family": "tinytest",
            "version": "0.0.1",
            "auto_map": {},
            "files": [],
            "custom": False,
        },
        "fingerprint": "0" * 64,
        "auto_map_before": None,
        "removed_auto_map": [],
        "files": [
            {
                "path": _target(case, victim),
                "action": "replaced",
                "patched_sha256": _sha(VICTIM_TEXT),
                "original_sha256": _sha(b"pwned\n"),
                "original_is_symlink": False,
                "backup": "payload.pypto_orig",
                "mode": 0o644,
            }
        ],
        "created_dirs": [],
        "cache_purged": [],
    }
    if bound:
        doc["folder"] = _identity(folder)
    return doc


CASES = ["absolute", "dotdot", "symlink"]


def _attempts(folder: Path, tmp_path: Path):
    yield "apply", lambda: pp.apply(folder, family="tinytest")
    yield "apply-other", lambda: pp.apply(folder, family="tinytest_alt")
    yield "restore", lambda: pp.restore(folder, force=True)
    yield "status", lambda: pp.status(folder)
    yield "verify", lambda: pp.verify_pinned(folder)
    yield "overlay", lambda: pp.apply(folder, family="tinytest", output_dir=tmp_path / "ov")
    yield "dry-run", lambda: pp.apply(folder, family="tinytest", dry_run=True)


@pytest.mark.parametrize("bound", [True, False], ids=["bound", "unbound"])
@pytest.mark.parametrize("action", ["created", "replaced"])
@pytest.mark.parametrize("case", CASES)
def test_forged_journal_never_touches_anything(hostile, snap, case, action, bound):
    """``bound``: even a journal that guessed the folder's inode is refused for its paths."""
    tmp_path, folder, victim = hostile
    (folder / JOURNAL_NAME).write_text(
        json.dumps(_journal(folder, victim, case, action, bound=bound))
    )
    before = snap(tmp_path)
    for name, attempt in _attempts(folder, tmp_path):
        with pytest.raises(UnsafeBookkeepingError) as ei:
            attempt()
        assert ei.value.exit_code == pp.EXIT.UNSAFE_BOOKKEEPING, name
        assert "\n" not in str(ei.value)
        assert JOURNAL_NAME in str(ei.value), (name, str(ei.value))
        assert snap(tmp_path) == before, name
    assert victim.read_bytes() == VICTIM_TEXT


@pytest.mark.parametrize("bound", [True, False], ids=["bound", "unbound"])
@pytest.mark.parametrize("case", CASES)
def test_forged_manifest_never_touches_anything(hostile, snap, case, bound):
    tmp_path, folder, victim = hostile
    (folder / MANIFEST_NAME).write_text(json.dumps(_manifest(folder, victim, case, bound=bound)))
    before = snap(tmp_path)
    for name, attempt in _attempts(folder, tmp_path):
        with pytest.raises(UnsafeBookkeepingError) as ei:
            attempt()
        assert ei.value.exit_code == pp.EXIT.UNSAFE_BOOKKEEPING, name
        assert MANIFEST_NAME in str(ei.value), (name, str(ei.value))
        assert snap(tmp_path) == before, name
    assert victim.read_bytes() == VICTIM_TEXT


def test_forged_records_through_the_cli(hostile, snap, run_cli):
    tmp_path, folder, victim = hostile
    (folder / JOURNAL_NAME).write_text(
        json.dumps(_journal(folder, victim, "dotdot", "created", bound=False))
    )
    before = snap(tmp_path)
    for args in (
        ["--model-family", "tinytest", "--model-path", str(folder)],
        ["restore", "--model-path", str(folder)],
        ["status", "--model-path", str(folder), "--json"],
        ["verify", "--model-path", str(folder)],
    ):
        p = run_cli(*args)
        assert p.returncode == pp.EXIT.UNSAFE_BOOKKEEPING, (args, p.stderr)
        assert p.stdout == ""
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert "Traceback" not in p.stderr
    assert snap(tmp_path) == before


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("[" * 100_000 + "]" * 100_000, id="deeply-nested"),
        pytest.param("not json", id="not-json"),
        pytest.param("[1, 2]", id="not-an-object"),
        pytest.param('{"tool": "pypto-patch", "op": "apply"}', id="no-binding"),
    ],
)
@pytest.mark.parametrize("name", [MANIFEST_NAME, JOURNAL_NAME])
def test_malformed_records_are_one_line_errors(hostile, snap, run_cli, content, name):
    tmp_path, folder, _victim = hostile
    (folder / name).write_text(content)
    before = snap(tmp_path)
    p = run_cli("restore", "--model-path", str(folder))
    assert p.returncode == pp.EXIT.UNSAFE_BOOKKEEPING, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert snap(tmp_path) == before


def test_a_record_that_is_a_symlink_is_refused(hostile, snap, tmp_path: Path):
    _tmp, folder, victim = hostile
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps(_manifest(folder, victim, "dotdot", bound=True)))
    os.symlink(real, folder / MANIFEST_NAME)
    before = snap(tmp_path)
    with pytest.raises(UnsafeBookkeepingError, match="not a plain file"):
        pp.restore(folder)
    assert snap(tmp_path) == before


def test_manifest_copied_with_its_folder_is_refused(tmp_path: Path, make_folder, snap):
    """A patched folder copied elsewhere (cp -a, rsync) carries a manifest bound to the original."""
    original = make_folder(tmp_path / "a" / "m")
    pristine = snap(original)
    pp.apply(original, family="tinytest")
    clone = tmp_path / "b" / "m"
    shutil.copytree(original, clone, symlinks=True)
    before = snap(tmp_path)
    for attempt in (
        lambda: pp.status(clone),
        lambda: pp.restore(clone, force=True),
        lambda: pp.apply(clone, family="tinytest_alt"),
        lambda: pp.apply(clone, family="tinytest"),
        lambda: pp.verify_pinned(clone),
    ):
        with pytest.raises(UnsafeBookkeepingError, match="written for another folder"):
            attempt()
        assert snap(tmp_path) == before
    # the original is still ours: a re-run (any later process) restores it
    pp.restore(original)
    assert snap(original) == pristine


def test_manifest_copied_into_a_fresh_folder_is_refused(tmp_path: Path, make_folder, snap):
    """Someone else's manifest dropped into a never-patched folder of the same name."""
    a = make_folder(tmp_path / "a" / "m")
    pp.apply(a, family="tinytest")
    b = make_folder(tmp_path / "b" / "m")
    shutil.copy2(a / MANIFEST_NAME, b / MANIFEST_NAME)
    shutil.copy2(a / "config.json.pypto_orig", b / "config.json.pypto_orig")
    before = snap(b)
    with pytest.raises(UnsafeBookkeepingError):
        pp.restore(b, force=True)
    assert snap(b) == before


def test_journal_copied_with_its_folder_is_refused(tmp_path: Path, make_folder, snap, run_cli):
    original = make_folder(tmp_path / "a" / "m")
    pristine = snap(original)
    p = run_cli(
        "--model-family", "tinytest", "--model-path", str(original),
        env={"PYPTO_PATCH_FAULT": "apply:first-file-written"},
    )  # fmt: skip
    assert p.returncode == pp.EXIT.FAULT_INJECTED
    clone = tmp_path / "b" / "m"
    shutil.copytree(original, clone, symlinks=True)
    before = snap(tmp_path)
    for attempt in (
        lambda: pp.apply(clone, family="tinytest"),
        lambda: pp.restore(clone),
        lambda: pp.status(clone),
    ):
        with pytest.raises(UnsafeBookkeepingError, match=JOURNAL_NAME):
            attempt()
        assert snap(tmp_path) == before
    # the original's own journal still rolls it back
    pp.restore(original)
    assert snap(original) == pristine


def test_moved_folder_is_refused_until_moved_back(tmp_path: Path, make_folder, snap):
    folder = make_folder(tmp_path / "m")
    pristine = snap(folder)
    pp.apply(folder, family="tinytest")
    moved = tmp_path / "moved"
    folder.rename(moved)
    before = snap(moved)
    with pytest.raises(UnsafeBookkeepingError, match="move it back"):
        pp.restore(moved)
    assert snap(moved) == before
    moved.rename(folder)
    assert pp.status(folder).intact
    pp.restore(folder)
    assert snap(folder) == pristine
