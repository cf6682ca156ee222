"""The kernel-agnostic cost-model layer: limits, cycles, measure, the worker process."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from pypto_kernels_common import Backend, Tiles, costmodel, sim, tiles_from_dict, tiles_to_dict

SMALL = {"rows": 8, "cols": 64}
UB_OVERFLOW = Tiles(rows=16, vec_rows=16)  # 16 x 4096 fp32 = 256 KB per tile > UB


def test_buffer_limits():
    assert costmodel.ub_fits(8, 2048)
    assert not costmodel.ub_fits(16, 2048)
    assert costmodel.cube_fits(32, 128, 512, 256, 2)
    assert not costmodel.cube_fits(32, 256, 512, 256, 2)  # L0B 128 KB


def test_read_cycles_takes_the_largest_report(tmp_path):
    for i, cycles in enumerate((900, 1800)):
        d = tmp_path / f"o{i}" / "CostModelSimulationOutput"
        d.mkdir(parents=True)
        (d / "_simulate.stat.report.txt").write_text(f"Total Cycles......: {cycles}\n")
    assert costmodel.read_cycles(tmp_path) == 1800
    assert costmodel.to_us(1800) == 1.0
    assert costmodel.read_cycles(tmp_path / "o0" / "none") is None


def test_tiles_round_trip_and_unknown_fields_are_one_line():
    t = Tiles(rows=4, cube_k=(64, 128))
    assert tiles_from_dict(tiles_to_dict(t)) == t
    with pytest.raises(costmodel.CostModelError, match=r"^unknown tile fields \['bogus'\]"):
        tiles_from_dict({"bogus": 1})


def test_builder_spec_is_checked_before_any_process_starts():
    with pytest.raises(ValueError, match="must be 'module:function'"):
        costmodel.Simulator("no colon here")


def test_a_shell_unsafe_temp_folder_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "a b"))
    with pytest.raises(sim.SimUnavailableError, match="set TMPDIR to a plain path"):
        costmodel.temp_root()


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """A temp root of this test's own, so leftovers are this code's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def test_a_builder_that_does_not_import_is_unavailable_not_a_hang(private_tmp):
    with (
        costmodel.Simulator("no_such_module_here:build", timeout_s=60) as runner,
        pytest.raises(sim.SimUnavailableError, match="no_such_module_here"),
    ):
        runner.simulate("add", SMALL, "fp32", Tiles())
    assert list(private_tmp.iterdir()) == []


@pytest.mark.slow
def test_measure_reads_cycles_and_leaves_no_files(pypto_cpu, toy_path, private_tmp):
    import toy_kernels

    bk = Backend(pypto_cpu.pypto, "cost")
    fn, args = toy_kernels.build(bk, "add", SMALL, "fp32", tiles_to_dict(Tiles(vec_rows=8)))
    cycles, wall = costmodel.measure(fn, *args)
    assert cycles
    assert wall > 0
    assert list(private_tmp.iterdir()) == []


@pytest.mark.slow
def test_the_worker_survives_a_failed_tiling(pypto_cpu, toy_path, private_tmp):
    """pypto 0.2.0 is broken in-process after a failed compile: a new worker takes over."""
    with costmodel.Simulator("toy_kernels:build", timeout_s=120) as runner:
        ok1 = runner.simulate("add", SMALL, "fp32", Tiles(vec_rows=8))
        assert ok1.ok, ok1.error
        bad = runner.simulate("add", {"rows": 16, "cols": 4096}, "fp32", UB_OVERFLOW)
        assert not bad.ok
        assert bad.error
        assert "\n" not in bad.error
        ok2 = runner.simulate("add", SMALL, "fp32", Tiles(vec_rows=8))
        assert ok2.cycles == ok1.cycles
        assert runner.started == 2
        assert ok2.to_dict()["tiles"]["vec_rows"] == 8
    assert list(private_tmp.iterdir()) == []
