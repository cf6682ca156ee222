"""The CPU shim: version gate, and a check that upstream still has the defect it fixes."""

import subprocess
import sys
import textwrap

import pytest
import torch

from pypto_kernels_gutenocr import sim_shim


def test_other_pypto_versions_are_refused(monkeypatch):
    monkeypatch.setattr(sim_shim, "installed_version", lambda: "0.3.0")
    with pytest.raises(sim_shim.SimUnavailableError, match=r"pypto==0.2.0 only, found 0.3.0"):
        sim_shim.install()


def test_missing_pypto_is_reported(monkeypatch):
    monkeypatch.setattr(sim_shim, "installed_version", lambda: None)
    with pytest.raises(sim_shim.SimUnavailableError, match="found None"):
        sim_shim.install()


_PROBE = textwrap.dedent(
    """
    import sys, torch
    from pypto_kernels_gutenocr import sim_shim
    pypto = sim_shim.import_pypto()
    if sys.argv[1] == "patched":
        sim_shim.install()
    else:
        sim_shim._load_calculator()  # cached build, upstream _setup_verify_data untouched

    @pypto.frontend.jit(**sim_shim.sim_options(pypto))
    def add(a: pypto.Tensor((8, 64), pypto.DT_FP32), b: pypto.Tensor((8, 64), pypto.DT_FP32),
            out: pypto.Tensor((8, 64), pypto.DT_FP32)):
        pypto.set_vec_tile_shapes(8, 64)
        out[:] = pypto.add(a, b)

    a = torch.full((8, 64), 1.5); b = torch.full((8, 64), 2.0); out = torch.full((8, 64), -7.0)
    add(a, b, out)
    print("RESULT", out.mean().item())
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "expected"), [("patched", 3.5), ("upstream", 0.0)])
def test_upstream_defect_and_fix(mode, expected, pypto_cpu, tmp_path):
    """Upstream 0.2.0 simulates zeros; the shim makes it use the real inputs.

    If the "upstream" run stops giving 0.0, PyPTO fixed the defect: drop the shim.
    """
    probe = tmp_path / "probe.py"  # a file: the jit parser reads kernel source with inspect
    probe.write_text(_PROBE)
    out = subprocess.run(
        [sys.executable, str(probe), mode],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, out.stderr[-2000:]
    assert float(line[0].split()[1]) == pytest.approx(expected)


def test_sim_options_enable_the_precision_tool_without_tensor_dumps(pypto_cpu):
    opts = sim_shim.sim_options(pypto_cpu.pypto)
    assert opts["verify_options"]["enable_pass_verify"] is True
    assert opts["verify_options"]["pass_verify_save_tensor"] is False
    assert torch.__version__  # torch imported before pypto
