"""Crash injection: a run killed between any two steps never loses the folder.

``PYPTO_PATCH_FAULT=<step>`` (test-only, listed in ``pypto_patch.FAULT_POINTS``) makes
the CLI ``os._exit(99)`` at that step, like a power cut. Right after the crash the
data files are untouched and config.json is either original or patched; the next
apply or restore reads the journal and leaves the folder original or fully patched.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import pypto_patch as pp

APPLY_POINTS = [p for p in pp.FAULT_POINTS if p.startswith("apply:")]
RESTORE_POINTS = [p for p in pp.FAULT_POINTS if p.startswith("restore:")]
OVERLAY_POINTS = [p for p in pp.FAULT_POINTS if p.startswith("overlay:")]
DATA = (
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "extras/README.md",
    "modeling_remote.py",
)


def _without_records(s: dict) -> dict:
    return {k: v for k, v in s.items() if k != ".pypto_patch.json"}


@pytest.fixture
def reference(tmp_path: Path, make_folder, snap):
    """Original and fully patched snapshots of an identical folder (manifest aside)."""
    ref = make_folder(tmp_path / "ref" / "m")
    original = snap(ref)
    pp.apply(ref, family="tinytest_alt")
    patched = _without_records(snap(ref))
    return original, patched


@pytest.mark.parametrize("point", APPLY_POINTS)
@pytest.mark.parametrize("recover_with", ["apply", "restore"])
def test_crash_during_apply(point, recover_with, tmp_path, make_folder, snap, run_cli, reference):
    original, patched = reference
    folder = make_folder(tmp_path / "x" / "m")
    p = run_cli(
        "--model-family",
        "tinytest_alt",
        "--model-path",
        str(folder),
        env={"PYPTO_PATCH_FAULT": point},
    )
    assert p.returncode == pp.EXIT.FAULT_INJECTED, p.stderr
    assert p.stdout == ""
    raw = snap(folder)
    for rel in DATA:
        assert raw[rel] == original[rel]
    assert raw["config.json"][1] in (original["config.json"][1], patched["config.json"][1])
    st = run_cli("status", "--model-path", str(folder), "--json")
    assert json.loads(st.stdout)["interrupted"] is True  # status reads, never repairs
    if recover_with == "apply":
        q = run_cli("--model-family", "tinytest_alt", "--model-path", str(folder))
        assert q.returncode == 0, q.stderr
        assert _without_records(snap(folder)) == patched
        assert pp.status(folder).intact
        q = run_cli("restore", "--model-path", str(folder))
        assert q.returncode == 0, q.stderr
    else:
        q = run_cli("restore", "--model-path", str(folder))
        assert q.returncode == 0, q.stderr
    assert snap(folder) == original


@pytest.mark.parametrize("point", RESTORE_POINTS)
def test_crash_during_restore(point, tmp_path, make_folder, snap, run_cli, reference):
    original, _ = reference
    folder = make_folder(tmp_path / "x" / "m")
    pp.apply(folder, family="tinytest_alt")
    p = run_cli("restore", "--model-path", str(folder), env={"PYPTO_PATCH_FAULT": point})
    assert p.returncode == pp.EXIT.FAULT_INJECTED, p.stderr
    raw = snap(folder)
    for rel in DATA:
        assert raw[rel] == original[rel]
    q = run_cli("restore", "--model-path", str(folder))
    assert q.returncode == 0, q.stderr
    assert snap(folder) == original


@pytest.mark.parametrize("point", OVERLAY_POINTS)
def test_crash_during_overlay_replace(point, tmp_path, make_folder, snap, run_cli):
    folder = make_folder(tmp_path / "x" / "m")
    original = snap(folder)
    out = tmp_path / "out"
    pp.apply(folder, family="tinytest", output_dir=out)
    first = snap(out)
    p = run_cli(
        "--model-family", "tinytest_alt", "--model-path", str(folder), "--output-dir", str(out), "--replace-overlay",
        env={"PYPTO_PATCH_FAULT": point},
    )  # fmt: skip
    assert p.returncode == pp.EXIT.FAULT_INJECTED, p.stderr
    assert snap(folder) == original
    if out.exists():
        assert snap(out) == first  # the old overlay, whole
    q = run_cli(
        "--model-family",
        "tinytest_alt",
        "--model-path",
        str(folder),
        "--output-dir",
        str(out),
        "--replace-overlay",
    )
    assert q.returncode == 0, q.stderr
    assert pp.status(out).family == "tinytest_alt"
    assert pp.status(out).intact
    assert not list(tmp_path.glob(".out.pypto_*"))
    assert snap(folder) == original
    shutil.rmtree(out)
