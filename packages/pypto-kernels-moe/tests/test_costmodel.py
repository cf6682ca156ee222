"""The cost-model builder: bad requests are one-line errors; both kernels simulate."""

from __future__ import annotations

import pytest

from pypto_kernels_common import CostModelError
from pypto_kernels_moe.costmodel import MoESimulator, check_shape
from pypto_kernels_moe.kernels import GROUPED_TILES, grouped_tiles


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

    for dtype, size in ((torch.bfloat16, 2), (torch.float32, 4)):
        t = grouped_tiles(dtype)
        assert cube_fits(t.cube_m[0], t.cube_k[0], t.cube_k[1], t.cube_n[0], size), (dtype, t)
    assert grouped_tiles(torch.bfloat16) is GROUPED_TILES


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
