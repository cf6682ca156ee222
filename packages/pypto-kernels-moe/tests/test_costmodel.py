"""The cost-model builder: bad requests are one-line errors; both kernels simulate."""

from __future__ import annotations

import pytest

from pypto_kernels_common import CostModelError
from pypto_kernels_moe.costmodel import MoESimulator, check_shape
from pypto_kernels_moe.kernels import (
    GROUPED_TILES,
    PER_EXPERT_TILES,
    cube_merge,
    grouped_tiles,
)


@pytest.mark.parametrize(
    ("kernel", "shape", "dtype", "message"),
    [
        ("dense", {}, "bf16", "unknown kernel 'dense'; choose one of grouped, per_expert"),
        ("grouped", {"tokens": 1}, "bf16", "grouped shape lacks top_k, hidden, inter"),
        ("per_expert", {"rows": 1, "hidden": 64, "inter": 32}, "int8", "unknown dtype 'int8'"),
    ],
)
def test_bad_requests_name_the_problem(kernel, shape, dtype, message):
    with pytest.raises(CostModelError, match=message):
        check_shape(kernel, shape, dtype)


def test_fp32_default_tiles_fit_l0b():
    import torch

    from pypto_kernels_common.costmodel import cube_fits

    for t, size in (
        (grouped_tiles(torch.bfloat16), 2),
        (grouped_tiles(torch.float32), 4),
        (PER_EXPERT_TILES, 2),
    ):
        assert cube_fits(t.cube_m[0], t.cube_k[0], t.cube_k[1], t.cube_n[0], size), (size, t)
    assert grouped_tiles(torch.bfloat16) is GROUPED_TILES


def test_cube_merge_fills_one_wave_of_cube_cores():
    assert cube_merge(8, 3072, 1536, 256) == 4  # MiniMax-M2: 96 tiles per matmul
    assert cube_merge(8, 2048, 512, 256) == 1  # LLaDA2.0-mini: 32 gate/up tiles
    assert cube_merge(2, 64, 32, 256) == 1  # tiny test experts
    assert cube_merge(16, 8192, 4096, 128) == 4  # capped


@pytest.mark.slow
def test_minimax_m2_decode_grouped_beats_the_loop():
    """The decode structure and tiles of issue #15 at MiniMax-M2's expert shape.

    Regression guard on the cost model (deterministic for pypto 0.2.0): the first
    kernel (one iteration per token, k slots summed inside it, 128/512 x 256 tiles) took
    167.3 us here; the (token, slot) loop with merged cube tasks 118.5 us. The per-expert
    loop runs at its own best tiles (8 x 41.3 us).
    """
    pytest.importorskip("pypto")
    shape = {"tokens": 1, "top_k": 8, "hidden": 3072, "inter": 1536, "experts": 8}
    with MoESimulator(timeout_s=300) as sim:
        g = sim.simulate("grouped", shape, "bf16", GROUPED_TILES)
        p = sim.simulate(
            "per_expert", {"rows": 1, "hidden": 3072, "inter": 1536}, "bf16", PER_EXPERT_TILES
        )
    assert g.ok, g.error
    assert p.ok, p.error
    assert g.sim_us is not None
    assert p.sim_us is not None
    assert g.sim_us < 125.0, g.sim_us
    assert 8 * p.sim_us / g.sim_us > 2.7, (g.sim_us, p.sim_us)


@pytest.mark.slow
def test_grouped_and_per_expert_simulate():
    pytest.importorskip("pypto")
    with MoESimulator(timeout_s=300) as sim:
        g = sim.simulate(
            "grouped", {"tokens": 1, "top_k": 4, "hidden": 256, "inter": 128}, "bf16", GROUPED_TILES
        )
        p = sim.simulate(
            "per_expert", {"rows": 1, "hidden": 256, "inter": 128}, "bf16", GROUPED_TILES
        )
    assert g.ok, g.error
    assert p.ok, p.error
    assert g.cycles
    assert p.cycles
