"""Overlay mode: the original folder is only read; OUT holds links plus real copies."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import pypto_patch as pp
from pypto_patch import (
    OVERLAY_MARKER_NAME,
    BadInputError,
    ModifiedSincePatchError,
    OutputDirError,
    OverlayRefusedError,
)


def test_overlay_links_everything_and_copies_only_changes(hf_folder: Path, tmp_path: Path, snap):
    before = snap(hf_folder)
    out = tmp_path / "overlay"
    res = pp.apply(hf_folder, family="tinytest", output_dir=out)
    assert res.mode == "overlay"
    assert res.model_path == str(out)
    assert snap(hf_folder) == before
    for entry in hf_folder.iterdir():
        if entry.name == "config.json":
            continue
        link = out / entry.name
        assert link.is_symlink()
        assert os.path.isabs(os.readlink(link))
        assert Path(os.readlink(link)) == entry
    assert not (out / "config.json").is_symlink()
    assert not (out / "modeling_tinytest.py").is_symlink()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["auto_map"]["AutoModelForCausalLM"] == "modeling_tinytest.TinyTestForCausalLM"
    assert not list(hf_folder.glob("*.pypto_orig"))
    st = pp.status(out)
    assert st.mode == "overlay"
    assert st.intact
    assert st.source_path == str(hf_folder)
    # same preset again: nothing to do
    assert pp.apply(hf_folder, family="tinytest", output_dir=out).action == "unchanged"
    with pytest.raises(BadInputError, match="overlay"):
        pp.restore(out)


def test_overlay_with_relative_paths_has_absolute_links(tmp_path: Path, make_folder, monkeypatch):
    folder = make_folder(tmp_path / "a" / "model")
    monkeypatch.chdir(tmp_path / "a")
    res = pp.apply("model", family="tinytest", output_dir="../b/out")
    out = tmp_path / "b" / "out"
    assert res.model_path == str(out)
    monkeypatch.chdir(tmp_path)  # links must resolve from anywhere
    assert (out / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    assert os.readlink(out / "model.safetensors") == str(folder / "model.safetensors")


def test_copy_into_a_subfolder_never_writes_through_the_link(hf_folder: Path, tmp_path: Path, snap):
    before = snap(hf_folder)
    out = tmp_path / "ov"
    res = pp.apply(hf_folder, family="tinytest_alt", output_dir=out)  # places extras/notes.txt
    assert res.action == "applied"
    assert snap(hf_folder) == before
    assert not (hf_folder / "extras" / "notes.txt").exists()
    assert (out / "extras").is_dir()
    assert not (out / "extras").is_symlink()
    assert (out / "extras" / "notes.txt").read_text() == "placed in a sub-folder\n"
    assert (out / "extras" / "README.md").is_symlink()
    assert pp.read_manifest(out)["materialized_dirs"] == ["extras"]


def test_earlier_overlay_is_replaced_only_with_replace_overlay(
    hf_folder: Path, tmp_path: Path, snap
):
    out = tmp_path / "ov"
    before = snap(hf_folder)
    pp.apply(hf_folder, family="tinytest", output_dir=out)
    assert (out / OVERLAY_MARKER_NAME).is_file()
    first = snap(out)
    # another preset over an earlier overlay: refused without --replace-overlay, even with --force
    for force in (False, True):
        with pytest.raises(OverlayRefusedError, match="--replace-overlay") as ei:
            pp.apply(hf_folder, family="tinytest_alt", output_dir=out, force=force)
        assert ei.value.exit_code == pp.EXIT.OVERLAY_REFUSED
        assert snap(out) == first
    res = pp.apply(hf_folder, family="tinytest_alt", output_dir=out, replace_overlay=True)
    assert res.replaced_overlay
    assert pp.status(out).family == "tinytest_alt"
    assert pp.status(out).intact
    assert snap(hf_folder) == before
    assert not list(tmp_path.glob(".ov.pypto_*"))


@pytest.mark.parametrize("flags", [{}, {"force": True}, {"replace_overlay": True, "force": True}])
def test_non_empty_folder_that_is_no_overlay_is_never_replaced(
    hf_folder: Path, tmp_path: Path, snap, flags
):
    out = tmp_path / "busy"
    (out / "sub").mkdir(parents=True)
    (out / "keep.txt").write_text("mine")
    (out / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before = snap(tmp_path)
    with pytest.raises(OverlayRefusedError, match="no pypto-patch overlay marker") as ei:
        pp.apply(hf_folder, family="tinytest", output_dir=out, **flags)
    assert ei.value.exit_code == pp.EXIT.OVERLAY_REFUSED
    assert "\n" not in str(ei.value)
    assert snap(tmp_path) == before


def test_copied_overlay_marker_is_refused(hf_folder: Path, tmp_path: Path, snap):
    """An overlay copied elsewhere (marker and all) does not make the copy replaceable."""
    first = tmp_path / "first"
    pp.apply(hf_folder, family="tinytest", output_dir=first)
    copy = tmp_path / "copy"
    shutil.copytree(first, copy, symlinks=True)
    (copy / "notes-i-kept.txt").write_text("precious")
    before = snap(tmp_path)
    with pytest.raises(OverlayRefusedError, match="written for another folder") as ei:
        pp.apply(
            hf_folder, family="tinytest_alt", output_dir=copy, replace_overlay=True, force=True
        )
    assert ei.value.exit_code == pp.EXIT.OVERLAY_REFUSED
    assert snap(tmp_path) == before
    # the moved original is refused the same way (its path no longer matches)
    moved = tmp_path / "moved"
    first.rename(moved)
    with pytest.raises(OverlayRefusedError):
        pp.apply(hf_folder, family="tinytest_alt", output_dir=moved, replace_overlay=True)
    assert (moved / OVERLAY_MARKER_NAME).is_file()


def test_forged_overlay_marker_is_refused(hf_folder: Path, tmp_path: Path, snap):
    """A hand-written marker (even one naming this folder's path and inode) is not enough."""
    out = tmp_path / "forged"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    ident = {"path": str(out), "dev": 0, "ino": os.stat(out).st_ino + 1}
    marker = {"tool": "pypto-patch", "kind": "overlay", "transaction": "0" * 32, "folder": ident}
    (out / OVERLAY_MARKER_NAME).write_text(json.dumps(marker))
    before = snap(tmp_path)
    with pytest.raises(OverlayRefusedError, match="written for another folder"):
        pp.apply(hf_folder, family="tinytest", output_dir=out, replace_overlay=True, force=True)
    assert snap(tmp_path) == before
    # the right inode but no manifest of the same transaction: still not an overlay we built
    marker["folder"]["ino"] = os.stat(out).st_ino
    (out / OVERLAY_MARKER_NAME).write_text(json.dumps(marker))
    before = snap(tmp_path)
    with pytest.raises(OverlayRefusedError, match="missing"):
        pp.apply(hf_folder, family="tinytest", output_dir=out, replace_overlay=True, force=True)
    assert snap(tmp_path) == before


def test_earlier_overlay_holding_foreign_files_is_refused(hf_folder: Path, tmp_path: Path, snap):
    out = tmp_path / "ov"
    pp.apply(hf_folder, family="tinytest_alt", output_dir=out)  # materializes extras/
    (out / "results.csv").write_text("a,b\n")
    (out / "extras" / "mine.txt").write_text("x")
    before = snap(tmp_path)
    with pytest.raises(OverlayRefusedError, match=r"results\.csv") as ei:
        pp.apply(hf_folder, family="tinytest", output_dir=out, replace_overlay=True, force=True)
    assert "extras/mine.txt" in str(ei.value)
    assert snap(tmp_path) == before


def test_edited_overlay_needs_force_to_be_replaced(hf_folder: Path, tmp_path: Path, snap):
    out = tmp_path / "ov"
    pp.apply(hf_folder, family="tinytest", output_dir=out)
    (out / "modeling_tinytest.py").write_text("# my debugging edit\n")
    before = snap(tmp_path)
    with pytest.raises(ModifiedSincePatchError, match="--force") as ei:
        pp.apply(hf_folder, family="tinytest_alt", output_dir=out, replace_overlay=True)
    assert ei.value.exit_code == pp.EXIT.MODIFIED
    assert snap(tmp_path) == before
    pp.apply(hf_folder, family="tinytest_alt", output_dir=out, replace_overlay=True, force=True)
    assert pp.status(out).family == "tinytest_alt"


def test_replace_overlay_without_output_dir_is_bad_usage(hf_folder: Path, snap):
    before = snap(hf_folder)
    with pytest.raises(BadInputError, match="--output-dir"):
        pp.apply(hf_folder, family="tinytest", replace_overlay=True)
    assert snap(hf_folder) == before


def test_leftover_build_folder_not_ours_is_never_deleted(hf_folder: Path, tmp_path: Path, snap):
    out = tmp_path / "ov"
    stray = tmp_path / ".ov.pypto_building"
    stray.mkdir()
    (stray / "important.txt").write_text("not pypto-patch's")
    before = snap(tmp_path)
    with pytest.raises(OverlayRefusedError, match="cannot prove"):
        pp.apply(hf_folder, family="tinytest", output_dir=out)
    assert snap(tmp_path) == before


@pytest.mark.parametrize("where", ["same", "inside", "contains", "same-relative"])
def test_no_flag_allows_any_overlap_with_the_model(
    hf_folder: Path, tmp_path: Path, snap, where, monkeypatch
):
    out = {
        "same": hf_folder,
        "inside": hf_folder / "extras",
        "contains": hf_folder.parent,
        "same-relative": Path("."),
    }[where]
    if where == "same-relative":
        monkeypatch.chdir(hf_folder)
    before = snap(tmp_path)
    with pytest.raises(OutputDirError) as ei:
        pp.apply(hf_folder, family="tinytest", output_dir=out, force=True, replace_overlay=True)
    assert ei.value.exit_code == pp.EXIT.USAGE
    assert snap(tmp_path) == before


def test_overlay_of_an_in_place_patched_folder_is_refused(hf_folder: Path, tmp_path: Path):
    pp.apply(hf_folder, family="tinytest")
    with pytest.raises(BadInputError, match="itself patched"):
        pp.apply(hf_folder, family="tinytest", output_dir=tmp_path / "o")
    assert not (tmp_path / "o").exists()
