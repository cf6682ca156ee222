"""overlay_links: the links an overlay's own bookkeeping records, and no other link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import pypto_patch as pp
from pypto_patch import UnsafeBookkeepingError


def test_an_overlay_lists_exactly_the_links_it_made(hf_folder: Path, tmp_path: Path, snap):
    out = tmp_path / "overlay"
    pp.apply(hf_folder, family="tinytest", output_dir=out)
    links = pp.overlay_links(out)
    made = {e.name for e in hf_folder.iterdir()} - {"config.json"}  # config.json is a copy
    assert set(links) == made
    assert links["model.safetensors"] == hf_folder / "model.safetensors"
    assert all(Path(os.readlink(out / rel)) == target for rel, target in links.items())
    assert "modeling_tinytest.py" not in links  # a real file the pin wrote
    before = snap(hf_folder)
    # planted later: a link beside the ones pypto-patch made, and one of them re-aimed
    elsewhere = tmp_path / "elsewhere.safetensors"
    elsewhere.write_bytes(b"x")
    (out / "extra.safetensors").symlink_to(elsewhere)
    (out / "tokenizer.json").unlink()
    (out / "tokenizer.json").symlink_to(elsewhere)
    again = pp.overlay_links(out)
    assert "extra.safetensors" not in again
    assert "tokenizer.json" not in again
    assert set(again) == made - {"tokenizer.json"}
    assert snap(hf_folder) == before


def test_a_folder_that_is_no_overlay_has_none(hf_folder: Path, tmp_path: Path):
    assert pp.overlay_links(hf_folder) == {}  # never patched
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "model.safetensors").symlink_to(hf_folder / "model.safetensors")
    assert pp.overlay_links(linked) == {}  # links, but no bookkeeping vouches for them
    pp.apply(hf_folder, family="tinytest")  # pinned in place: nothing is a link
    assert pp.overlay_links(hf_folder) == {}


def test_bookkeeping_copied_from_another_overlay_is_refused(hf_folder: Path, tmp_path: Path):
    out = tmp_path / "overlay"
    pp.apply(hf_folder, family="tinytest", output_dir=out)
    forged = tmp_path / "forged"
    forged.mkdir()
    for entry in out.iterdir():
        if entry.is_symlink():
            (forged / entry.name).symlink_to(os.readlink(entry))
        else:
            (forged / entry.name).write_bytes(entry.read_bytes())
    with pytest.raises(UnsafeBookkeepingError, match="was written for another folder"):
        pp.overlay_links(forged)
