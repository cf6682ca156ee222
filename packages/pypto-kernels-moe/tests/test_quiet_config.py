"""The test process runs PyPTO with the shim's quiet config (no swim-lane drawing)."""

from __future__ import annotations

import pytest
import torch
from _moe_fixtures import qwen3_moe_experts, routing

from pypto_kernels_moe import PACKAGE, grouped_gemm

pytestmark = pytest.mark.slow


def test_sim_calls_draw_no_swim_lanes(pypto_cpu, tmp_path, monkeypatch):
    """Fails when something imports pypto before TILEFWK_CONFIG_PATH is set (as
    pytest.importorskip("pypto") in a fixture did): PyPTO then keeps its default
    Model.drawPngThresholdCycle (500000) and every SIM call under that many cycles writes
    the swim-lane traces and runs PyPTO's matplotlib scripts on them (tens of seconds)."""
    monkeypatch.setenv("PYPTO_KERNELS_KEEP_OUTPUT", "1")
    monkeypatch.setenv("TILE_FWK_OUTPUT_DIR", str(tmp_path))
    module = qwen3_moe_experts()
    x, ids, w = routing(1, 2, 8, 64)
    PACKAGE.switches.set_switch("grouped_gemm", True)
    with torch.no_grad():
        grouped_gemm(x, ids, w, module.gate_up_proj, module.down_proj)
    (config,) = tmp_path.glob("*/CostModelSimulationOutput/_simulate.config.ini")
    assert "drawPngThresholdCycle = 0" in config.read_text()
    assert not list(tmp_path.glob("**/_simulate.pipe.swim.json"))
