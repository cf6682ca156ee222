"""pypto-bench's outputs go through pypto-common's one atomic writer: a symlink planted at
an output's name is replaced, the file it points to untouched (issue #27, item 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pypto_bench import plot, write_report


def _report() -> dict:
    return {
        "schema_version": "1.0",
        "regime": "decode",
        "config": {"dtype": "float32", "batch": 1},
        "model": {"class": "Tiny"},
        "command_line": [],
        "arms": [{"name": "eager", "ok": True, "tokens_per_s": {"best": 10.0}}],
    }


def _plant(path: Path, outside: Path) -> None:
    outside.write_text("keep me")
    path.symlink_to(outside)


def test_report_and_plot_replace_planted_links(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report, png = tmp_path / "report.json", tmp_path / "bench.png"
    _plant(report, tmp_path / "outside-report")
    _plant(png, tmp_path / "outside-png")
    assert write_report(_report(), report) == report
    assert plot(_report(), png) == png
    for path, outside in ((report, "outside-report"), (png, "outside-png")):
        assert (tmp_path / outside).read_text() == "keep me"
        assert not path.is_symlink()
        assert path.is_file()
    assert json.loads(report.read_text())["arms"][0]["name"] == "eager"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_fallback_report_is_a_fresh_regular_file(tmp_path: Path) -> None:
    gone = tmp_path / "gone" / "r.json"  # its folder does not exist: the fallback is used
    keep = tmp_path / "fallback"
    keep.mkdir()
    written = write_report(_report(), gone, fallback_dir=[keep])
    assert written.parent == keep
    assert written.is_file()
    assert not written.is_symlink()
    assert json.loads(written.read_text())["regime"] == "decode"
    assert [p.name for p in keep.iterdir()] == [written.name]
