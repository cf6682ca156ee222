"""msprof-analyze (Ascend's cluster analysis and advisor) on the `*_ascend_pt` layout we read
and write (issue #45): the real tool, installed only by `nox -s interop` (skipped
elsewhere). The folders are the ones this package's NPU tests read, written in torch_npu's
text export layout with `profiler_info_<rank>.json` beside the output, as torch_npu does."""

from __future__ import annotations

import csv
import shutil
import subprocess
from pathlib import Path

import pytest

from pypto_tune import npu

EXE = shutil.which("msprof-analyze")
pytestmark = pytest.mark.skipif(
    EXE is None, reason="msprof-analyze is installed by `nox -s interop` only"
)


def _write(parent: Path, rank: int | None) -> Path:
    from test_npu import write_profile  # the NPU tests' folder builder

    return write_profile(parent, f"host_{4242 + (rank or 0)}_2026113012000000{rank or 0}_ascend_pt",
                         rank=rank)  # fmt: skip


def test_cluster_analysis_reads_every_rank(tmp_path: Path) -> None:
    """`cluster -m all` on two rank folders: both ranks in its step table, with the figures
    our reader reads from the same files (it refused these folders, exit 0, without the
    rank file)."""
    parent = tmp_path / "ranks"
    folders = [_write(parent, r) for r in (0, 1)]
    out = tmp_path / "cluster"
    got = subprocess.run([EXE, "cluster", "-d", str(parent), "-m", "all", "-o", str(out)],
                         capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    table = out / "cluster_analysis_output" / "cluster_step_trace_time.csv"
    with table.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["Type"] == "rank"]
    assert sorted(int(r["Index"]) for r in rows) == [0, 1]
    ours = npu.read_ascend_output(folders[0]).extra["step_trace_time"][0]
    for row in rows:
        assert float(row["Computing"]) == ours["Computing"]
        assert float(row["Free"]) == ours["Free"]


def test_the_advisor_reads_a_folder_and_an_empty_one_is_said(tmp_path: Path) -> None:
    """`advisor all` through pypto-tune: findings from a folder with data (the AI_CPU
    IndexPut it holds); a folder with no data is not "ok, no findings" but says so."""
    folder = _write(tmp_path / "one", 0)
    result = npu.run_msprof_advisor(folder, timeout_s=300)
    assert result["available"], result
    assert result["ok"], result
    titles = " ".join(f"{f['title']} {f['detail']}" for f in result["findings"])
    assert "AICPU" in titles, result["findings"]
    assert "IndexPut" in titles, result["findings"]
    empty = tmp_path / "empty" / "host_1_20261130120000000_ascend_pt"
    empty.mkdir(parents=True)
    nothing = npu.run_msprof_advisor(empty, timeout_s=300)
    assert nothing["returncode"] == 0  # the tool itself says nothing is wrong ...
    assert nothing["ok"] is False  # ... we say it read nothing
    assert "loaded no profiling data" in nothing["error"]
