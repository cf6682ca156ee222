"""Overlay mode: the original folder is only read; OUT holds links plus real copies."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import pypto_patch as pp
from pypto_patch import BadInputError, OutputDirError


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


def test_non_empty_output_needs_force_and_force_replaces(hf_folder: Path, tmp_path: Path, snap):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputDirError, match="--force"):
        pp.apply(hf_folder, family="tinytest", output_dir=out)
    assert (out / "keep.txt").read_text() == "mine"
    before = snap(hf_folder)
    pp.apply(hf_folder, family="tinytest", output_dir=out, force=True)
    assert not (out / "keep.txt").exists()
    assert pp.status(out).intact
    # another preset over an existing overlay: --force replaces it, the model never changes
    pp.apply(hf_folder, family="tinytest_alt", output_dir=out, force=True)
    assert pp.status(out).family == "tinytest_alt"
    assert snap(hf_folder) == before
    assert not list(tmp_path.glob(".busy.pypto_*"))


@pytest.mark.parametrize("where", ["same", "inside", "contains", "same-relative"])
def test_force_refuses_any_overlap_with_the_model(
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
        pp.apply(hf_folder, family="tinytest", output_dir=out, force=True)
    assert ei.value.exit_code == 2
    assert snap(tmp_path) == before


def test_overlay_of_an_in_place_patched_folder_is_refused(hf_folder: Path, tmp_path: Path):
    pp.apply(hf_folder, family="tinytest")
    with pytest.raises(BadInputError, match="itself patched"):
        pp.apply(hf_folder, family="tinytest", output_dir=tmp_path / "o")
    assert not (tmp_path / "o").exists()
