"""The CPU shim: version gate, cache, environment, and a check that upstream still has
the defect it fixes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pypto_kernels_common import sim


def test_other_pypto_versions_are_refused(monkeypatch):
    monkeypatch.setattr(sim, "installed_version", lambda: "0.3.0")
    with pytest.raises(sim.SimUnavailableError, match=r"pypto==0.2.0 only, found 0.3.0"):
        sim.install()


def test_missing_pypto_is_reported_with_the_callers_install_hint(monkeypatch):
    monkeypatch.setattr(sim, "installed_version", lambda: None)
    with pytest.raises(sim.SimUnavailableError, match=r"found None \(pip install 'x\[pypto\]'\)"):
        sim.install("pip install 'x[pypto]'")
    assert sim.availability("HINT") == "pypto is not installed (HINT)"


def test_missing_compiler_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a real lookup on a PATH without g++
    reason = sim.availability() or ""
    if sim.installed_version() == sim.SUPPORTED_VERSION:
        assert reason.startswith("g++ is not on PATH")
    with pytest.raises(sim.SimUnavailableError, match=r"missing build tools.*g\+\+"):
        sim.check_toolchain()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"PYPTO_KERNELS_CACHE": "new", "PYPTO_GUTENOCR_CACHE": "old"}, "new"),
        ({"PYPTO_GUTENOCR_CACHE": "old"}, "old"),  # the name used before this package
        ({"XDG_CACHE_HOME": "xdg"}, "xdg/pypto-kernels"),
    ],
)
def test_cache_root_prefers_the_generic_variable(monkeypatch, tmp_path, env, expected):
    for var in (*sim.CACHE_ENV, "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, str(tmp_path / value))
    assert sim.cache_root() == tmp_path / expected


def test_a_relative_cache_root_is_made_absolute(monkeypatch, tmp_path):
    """The cost-model worker runs in its own folder: a relative cache must not move with it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYPTO_KERNELS_CACHE", "rel/cache")
    assert sim.cache_root() == tmp_path / "rel" / "cache"
    monkeypatch.delenv("PYPTO_KERNELS_CACHE")
    monkeypatch.delenv("PYPTO_GUTENOCR_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "xdg")
    assert sim.cache_root() == tmp_path / "xdg" / "pypto-kernels"


def test_prepare_environment_points_pypto_into_the_cache(monkeypatch, tmp_path):
    """PyPTO reads these at load; without them it writes ./output and ~/ascend."""
    monkeypatch.setenv("PYPTO_KERNELS_CACHE", str(tmp_path / "cache"))
    for var in ("TILE_FWK_OUTPUT_DIR", "ASCEND_PROCESS_LOG_PATH", "TILEFWK_CONFIG_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PYPTO_HOME", str(tmp_path / "mine"))  # a value the user set wins
    run = sim.prepare_environment()
    assert run == tmp_path / "cache" / "run"
    assert os.environ["TILE_FWK_OUTPUT_DIR"] == str(run / "output")
    assert os.environ["ASCEND_PROCESS_LOG_PATH"] == str(run / "log")
    assert os.environ["PYPTO_HOME"] == str(tmp_path / "mine")
    assert all((run / d).is_dir() for d in ("output", "log", "home"))
    if sim.installed_version() is not None:
        cfg = json.loads(Path(os.environ["TILEFWK_CONFIG_PATH"]).read_text())
        simulation = cfg["global"]["simulation"]
        assert simulation["draw_function_graph"] is False
        assert "Model.drawPngThresholdCycle=0" in simulation["args"]
        assert [p.name for p in (tmp_path / "cache").glob("*.tmp")] == []


def test_keep_outputs_honours_both_names(monkeypatch, tmp_path):
    out = tmp_path / "out"
    (out / f"output_1_{os.getpid()}_x").mkdir(parents=True)
    (out / "output_1_999999999_x").mkdir()  # another process's: never touched
    monkeypatch.setenv("TILE_FWK_OUTPUT_DIR", str(out))
    for var in sim.KEEP_OUTPUT_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PYPTO_GUTENOCR_KEEP_OUTPUT", "1")
    sim.discard_run_outputs(set())
    assert len(list(out.iterdir())) == 2
    monkeypatch.delenv("PYPTO_GUTENOCR_KEEP_OUTPUT")
    sim.discard_run_outputs(set())
    assert [p.name for p in out.iterdir()] == ["output_1_999999999_x"]


_PROBE = textwrap.dedent(
    """
    import logging, sys, torch
    from pypto_kernels_common import sim
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    pypto = sim.import_pypto()
    if sys.argv[1] == "patched":
        sim.install()
    else:
        sim.load_calculator()  # cached build, upstream _setup_verify_data untouched

    @pypto.frontend.jit(**sim.sim_options(pypto))
    def add(a: pypto.Tensor((8, 64), pypto.DT_FP32), b: pypto.Tensor((8, 64), pypto.DT_FP32),
            out: pypto.Tensor((8, 64), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(8, 64)
        out[:] = pypto.add(a, b)

    a = torch.full((8, 64), 1.5); b = torch.full((8, 64), 2.0); out = torch.full((8, 64), -7.0)
    add(a, b, out)
    print("RESULT", out.mean().item())
    """
)


def _probe(mode: str, tmp_path: Path, env: dict[str, str] | None = None) -> tuple[float, str]:
    probe = tmp_path / "probe.py"  # a file: the jit parser reads kernel source with inspect
    probe.write_text(_PROBE)
    out = subprocess.run(
        [sys.executable, str(probe), mode],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
    )
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, out.stderr[-2000:]
    return float(line[0].split()[1]), out.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "expected"), [("patched", 3.5), ("upstream", 0.0)])
def test_upstream_defect_and_fix(mode, expected, pypto_cpu, tmp_path):
    """Upstream 0.2.0 simulates zeros; the shim makes it use the real inputs.

    If the "upstream" run stops giving 0.0, PyPTO fixed the defect: drop the shim.
    """
    result, _ = _probe(mode, tmp_path)
    assert result == pytest.approx(expected)


@pytest.mark.slow
def test_calculator_is_loaded_from_the_cache_not_rebuilt(pypto_cpu, tmp_path):
    """A populated cache folder (keyed by pypto, torch and ABI) is loaded as it is."""
    built = sim.calculator_folder() / "install"
    assert (built / "lib" / "libtile_fwk_calculator.so").is_file()  # pypto_cpu built it
    cache = tmp_path / "cache"
    key = sim.calculator_folder().name
    assert key.startswith(f"pypto{sim.SUPPORTED_VERSION}-torch")
    assert "+" not in key
    shutil.copytree(built, cache / "calculator" / key / "install")
    result, log = _probe("patched", tmp_path, {"PYPTO_KERNELS_CACHE": str(cache)})
    assert result == pytest.approx(3.5)
    assert "building PyPTO's verify calculator" not in log


def test_sim_options_enable_the_precision_tool_without_tensor_dumps(pypto_cpu):
    opts = sim.sim_options(pypto_cpu.pypto)
    assert opts["verify_options"]["enable_pass_verify"] is True
    assert opts["verify_options"]["pass_verify_save_tensor"] is False
    assert opts["runtime_options"]["run_mode"] == pypto_cpu.pypto.RunMode.SIM
    assert torch.__version__  # torch imported before pypto
