"""The cost-model API pypto-tune's tile search drives: candidates, shapes, real SIM runs."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

from pypto_kernels_common import Backend
from pypto_kernels_gutenocr import costmodel as cm
from pypto_kernels_gutenocr import kernels, sim_shim
from pypto_kernels_gutenocr.kernels import Tiles
from pypto_kernels_gutenocr.plugin import PLUGIN

TOOL = Path(__file__).parents[3] / "tools" / "bench_gutenocr_costmodel.py"

# Tilings the simulator refuses (probed on pypto 0.2.0): the search must not propose them.
UB_OVERFLOW_RMS = Tiles(rows=16, vec_rows=16, vec_cols=2048)  # fp32 MUL in/out 256 KB > UB
L0B_OVERFLOW_MLP = Tiles(
    rows=64, vec_rows=8, vec_cols=2048, cube_m=(32, 32), cube_k=(256, 512), cube_n=(256, 256)
)  # 256 x 256 x 2 B = 128 KB > L0B
UB_OVERFLOW_MLP = Tiles(
    rows=64, vec_rows=16, vec_cols=2048, cube_m=(32, 32), cube_k=(128, 512), cube_n=(256, 256)
)
SMALL_RMS = {"rows": 16, "hidden": 512}
SMALL_MLP = {"rows": 16, "hidden": 256, "inter": 512}


# --------------------------------------------------------------------------- candidates


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_defaults_are_the_kernels_own(dtype):
    tdt = cm.DTYPES[dtype]
    assert cm.default_tiles("rms_norm", dtype) == kernels.rms_tiles(tdt)
    assert cm.default_tiles("swiglu_mlp", dtype) == kernels.swiglu_tiles(tdt)


@pytest.mark.parametrize(
    ("kernel", "shape"),
    [
        ("rms_norm", {"rows": 16, "hidden": 2048}),
        ("rms_norm", {"rows": 1, "hidden": 64}),
        ("swiglu_mlp", {"rows": 16, "hidden": 2048, "inter": 11008}),
        ("swiglu_mlp", SMALL_MLP),
    ],
)
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_candidates_respect_buffer_limits_and_include_the_default(kernel, shape, dtype):
    cands = cm.candidate_tiles(kernel, shape, dtype)
    assert cands[0] == cm.default_tiles(kernel, dtype)
    assert len(set(cands)) == len(cands)
    elem = torch.empty((), dtype=cm.DTYPES[dtype]).element_size()
    width = shape["hidden"] if kernel == "rms_norm" else shape["inter"]
    for t in cands[1:]:
        assert t.vec_rows <= t.rows
        assert t.rows % t.vec_rows == 0
        assert cm.ub_fits(t.vec_rows, min(t.vec_cols, width)), t
        if kernel == "swiglu_mlp":
            m, (k0, k1), n = t.cube_m[0], t.cube_k, t.cube_n[0]
            assert cm.cube_fits(m, k0, k1, n, elem), t
            assert m % cm.CUBE_ALIGN == 0
            assert m <= t.rows


def test_candidates_exclude_tilings_the_simulator_refuses():
    assert UB_OVERFLOW_RMS not in cm.candidate_tiles("rms_norm", {"rows": 64, "hidden": 2048})
    mlp = cm.candidate_tiles("swiglu_mlp", {"rows": 64, "hidden": 512, "inter": 2048})
    assert L0B_OVERFLOW_MLP not in mlp
    assert UB_OVERFLOW_MLP not in mlp


def test_equivalent_column_tiles_are_spelled_like_the_default():
    """vec_cols 2048 and 512 tile a 512-wide row the same: one candidate, the default's."""
    cands = cm.candidate_tiles("rms_norm", SMALL_RMS, "bf16")
    assert not any(t.vec_cols == 512 for t in cands)
    assert Tiles(rows=16, vec_rows=8, vec_cols=2048) in cands


@pytest.mark.parametrize(
    ("kernel", "shape", "dtype", "msg"),
    [
        ("flash_attn", {"rows": 1}, "bf16", "tunable kernels: ['rms_norm', 'swiglu_mlp']"),
        ("rms_norm", {"rows": 16}, "bf16", "missing ['hidden']"),
        ("rms_norm", {"rows": 16, "hidden": 512, "inter": 8}, "bf16", "unknown ['inter']"),
        ("rms_norm", {"rows": 0, "hidden": 512}, "bf16", "rows=0 must be a positive integer"),
        ("rms_norm", {"rows": "16", "hidden": 512}, "bf16", "must be a positive integer"),
        ("rms_norm", {"rows": 16, "hidden": 100}, "bf16", "outside the kernel's envelope"),
        ("rms_norm", {"rows": 16, "hidden": 16384}, "bf16", "outside the kernel's envelope"),
        ("swiglu_mlp", {"rows": 4, "hidden": 256, "inter": 100}, "bf16", "intermediate 100"),
        ("rms_norm", {"rows": 10**6, "hidden": 512}, "bf16", "above the search's limit"),
        ("rms_norm", SMALL_RMS, "int8", "use one of"),
    ],
)
def test_bad_requests_are_one_line_errors(kernel, shape, dtype, msg):
    with pytest.raises(cm.CostModelError, match=r"^[^\n]*$") as err:
        cm.candidate_tiles(kernel, shape, dtype)
    assert msg in str(err.value)


def test_tiles_round_trip_through_json_dicts():
    t = cm.default_tiles("swiglu_mlp", "bf16")
    assert cm.tiles_from_dict(cm.tiles_to_dict(t)) == t
    with pytest.raises(cm.CostModelError, match="unknown tile fields"):
        cm.tiles_from_dict({"rows": 8, "bogus": 1})


# --------------------------------------------------------------------------- plug-in


def test_plugin_exposes_tunables_through_its_entry_point():
    (ep,) = [e for e in entry_points(group="pypto.kernels") if e.name == "gutenocr"]
    plugin = ep.load()
    assert plugin is PLUGIN
    tunables = plugin.tunables()
    assert set(tunables) == {"rms_norm", "swiglu_mlp"}
    for name, t in tunables.items():
        for attr in ("simulate", "candidate_tiles", "default_tiles", "shape_names", "session"):
            assert hasattr(t, attr), (name, attr)
    assert tunables["swiglu_mlp"].shape_names == ("rows", "hidden", "inter")


def test_without_pypto_the_reason_names_the_install(monkeypatch):
    monkeypatch.setattr(sim_shim, "installed_version", lambda: None)
    assert "pip install 'pypto-kernels-gutenocr[pypto]'" in (cm.availability() or "")
    with pytest.raises(sim_shim.SimUnavailableError, match=r"pypto-kernels-gutenocr\[pypto\]"):
        cm.simulate("rms_norm", SMALL_RMS)


def test_without_gxx_the_reason_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a real lookup on a PATH without g++
    assert "g++ is not on PATH" in (cm.availability() or "")


# --------------------------------------------------------------------------- real SIM runs


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """A temp root of this test's own, so leftovers are this code's (other processes
    on the machine create their own pypto-* folders in /tmp)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # and for child processes
    return tmp_path


def _skip_without_sim() -> None:
    pytest.importorskip("pypto")
    if cm.availability():
        pytest.skip(cm.availability() or "")


@pytest.fixture(scope="module")
def simulator():
    _skip_without_sim()
    with cm.Simulator(timeout_s=120) as sim:
        yield sim


@pytest.mark.slow
def test_a_failed_tiling_does_not_sink_the_next(simulator):
    """A refused tiling leaves PyPTO 0.2.0 broken in its process (the next compile raises
    "function nested is not allowed" or hangs): the worker is replaced, so the same
    Simulator goes on giving the same, deterministic numbers."""
    ok1 = simulator.simulate("rms_norm", SMALL_RMS, "bf16", cm.default_tiles("rms_norm"))
    assert ok1.ok, ok1.error
    assert ok1.cycles
    assert ok1.sim_us == pytest.approx(ok1.cycles / cm.CYCLES_PER_US)
    starts = simulator.started
    bad = simulator.simulate("rms_norm", {"rows": 64, "hidden": 2048}, "bf16", UB_OVERFLOW_RMS)
    assert not bad.ok
    assert bad.sim_us is None
    assert "exceeds MEM_UB" in (bad.error or ""), bad.error  # PyPTO's own reason, one line
    assert "\n" not in (bad.error or "")
    ok2 = simulator.simulate("rms_norm", SMALL_RMS, "bf16", cm.default_tiles("rms_norm"))
    assert ok2.ok, ok2.error
    assert ok2.cycles == ok1.cycles
    assert simulator.started == starts + 1


@pytest.mark.slow
def test_tiles_change_the_simulated_time(simulator):
    fast = simulator.simulate("rms_norm", SMALL_RMS, "bf16", Tiles(rows=8, vec_rows=8))
    slow = simulator.simulate("rms_norm", SMALL_RMS, "bf16", Tiles(rows=8, vec_rows=1))
    mlp = simulator.simulate("swiglu_mlp", SMALL_MLP, "bf16", cm.default_tiles("swiglu_mlp"))
    assert all(r.ok for r in (fast, slow, mlp)), (fast.error, slow.error, mlp.error)
    assert slow.sim_us > 1.3 * fast.sim_us
    assert mlp.to_dict()["tiles"]["cube_k"] == [128, 512]


@pytest.mark.slow
def test_a_candidate_over_its_timeout_is_stopped(private_tmp):
    """The killed worker's per-call output folder (up to 170 MB) goes with it."""
    _skip_without_sim()
    with cm.Simulator(timeout_s=120) as sim:
        assert sim.simulate("rms_norm", SMALL_RMS, "bf16", cm.default_tiles("rms_norm")).ok
        sim.timeout_s = 0.01
        res = sim.simulate("rms_norm", SMALL_RMS, "bf16", Tiles(rows=8, vec_rows=2))
        assert not res.ok
        assert "timed out after" in (res.error or "")
        assert [p.name for p in private_tmp.iterdir()] == [sim._tmp.name]
        assert [p for p in sim._tmp.iterdir() if p.is_dir()] == []
        sim.timeout_s = 120
        again = sim.simulate("rms_norm", SMALL_RMS, "bf16", Tiles(rows=8, vec_rows=2))
        assert again.ok, again.error
    assert list(private_tmp.iterdir()) == []


@pytest.mark.slow
def test_simulate_leaves_no_files(pypto_cpu, private_tmp):
    out_dir = os.environ["TILE_FWK_OUTPUT_DIR"]
    out_before = set(os.listdir(out_dir))
    res = cm.simulate("rms_norm", SMALL_RMS, "bf16")
    assert res.ok, res.error
    assert list(private_tmp.iterdir()) == []
    assert set(os.listdir(out_dir)) == out_before


@pytest.mark.slow
def test_measure_reads_cycles_from_a_per_call_output_folder(pypto_cpu, private_tmp):
    """PyPTO re-reads TILE_FWK_OUTPUT_DIR per call; measure() relies on that (if upstream
    stops, cycles come back None here) and deletes the folder."""
    bk = Backend(pypto_cpu.pypto, "cost")
    fn, args = cm._build_call(bk, "rms_norm", SMALL_RMS, "bf16", Tiles(rows=8, vec_rows=8))
    out_dir = os.environ["TILE_FWK_OUTPUT_DIR"]
    out_before = set(os.listdir(out_dir))
    cycles, wall = cm.measure(fn, *args)
    assert cycles
    assert cycles > 0
    assert wall > 0
    assert set(os.listdir(out_dir)) == out_before
    assert list(private_tmp.iterdir()) == []


# --------------------------------------------------------------------------- the tool


def test_costmodel_tool_help_runs():
    out = subprocess.run(
        [sys.executable, str(TOOL), "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "--rows" in out.stdout


@pytest.mark.slow
def test_costmodel_tool_runs_at_small_shapes(pypto_cpu):
    out = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "--rows",
            "4",
            "--hidden",
            "256",
            "--inter",
            "512",
            "--rms-rows",
            "16",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    rows = json.loads(out.stdout)
    assert {r["bench"] for r in rows} >= {"swiglu fused vs split", "swiglu tiles", "rms_norm tiles"}
    assert all(r.get("sim_us", 1) for r in rows)
