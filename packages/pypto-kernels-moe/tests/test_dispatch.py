"""Switch, envelope and counted fallbacks; the custom op inside torch.compile."""

from __future__ import annotations

import logging

import pytest
import torch
from _moe_fixtures import qwen3_moe_experts, routing

import pypto_kernels_moe
from pypto_kernels_moe import ENVELOPE, PACKAGE, grouped_gemm, grouped_gemm_reference, report


def _args(tokens=2, k=2, experts=8, hidden=64, inter=32):
    module = qwen3_moe_experts(hidden, inter, experts)
    x, ids, w = routing(tokens, k, experts, hidden)
    return x, ids, w, module.gate_up_proj.detach(), module.down_proj.detach()


def test_switch_off_is_the_reference_and_counted():
    args = _args()
    assert not pypto_kernels_moe.USE_PTO_GROUPED_GEMM
    torch.testing.assert_close(grouped_gemm(*args), grouped_gemm_reference(*args), rtol=0, atol=0)
    r = report()
    assert r["calls"]["grouped_gemm"] == {"pypto": 0, "reference": 1}
    assert r["fallback_reasons"]["grouped_gemm"] == "switch USE_PTO_GROUPED_GEMM is off"


def test_module_attribute_and_env_name_drive_the_same_switch():
    pypto_kernels_moe.USE_PTO_GROUPED_GEMM = True
    assert PACKAGE.switches.is_on("grouped_gemm")
    assert report()["switches"] == {"USE_PTO_GROUPED_GEMM": True}


@pytest.mark.parametrize(
    ("shape", "reason"),
    [
        ({"hidden": 40}, "hidden 40 / expert intermediate 32 outside envelope"),
        ({"inter": 24}, "expert intermediate 24 outside envelope"),
        ({"k": 17, "experts": 32}, "top_k 17 outside envelope"),
    ],
)
def test_outside_the_envelope_falls_back_counted_and_logged_once(shape, reason, caplog):
    PACKAGE.switches.set_switch("grouped_gemm", True)
    args = _args(**shape)
    with caplog.at_level(logging.WARNING, logger="pypto_kernels_moe"):
        for _ in range(3):
            out = grouped_gemm(*args)
    torch.testing.assert_close(out, grouped_gemm_reference(*args), rtol=1e-5, atol=1e-6)
    r = report()
    assert r["calls"]["grouped_gemm"] == {"pypto": 0, "reference": 3}
    assert reason in r["fallback_reasons"]["grouped_gemm"]
    assert len([m for m in caplog.messages if reason in m]) == 1


def test_envelope_names_a_down_proj_that_does_not_match_gate_up():
    x, ids, _, gu, dn = _args()
    reason = ENVELOPE.violation([x, ids, gu, dn[:, :, :16]])
    assert reason is not None
    assert "down (8, 64, 16) must be [8, 64, 32]" in reason


def test_unknown_activation_is_a_one_line_error_naming_the_choices():
    with pytest.raises(
        ValueError, match="unknown activation 'relu'; choose one of silu, gelu_tanh, swigluoai"
    ):
        grouped_gemm(*_args(), "relu")


def test_switched_on_op_compiles_as_one_graph_and_dispatches_per_call():
    """fullgraph=True: no graph break; the op's body (dispatch + count) runs every call."""
    PACKAGE.switches.set_switch("grouped_gemm", True)
    x, ids, w, gu, dn = _args(inter=24)  # outside the envelope: the counted reference path

    def step(x, ids, w):
        return grouped_gemm(x, ids, w, gu, dn) * 2

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    for _ in range(3):
        out = compiled(x, ids, w)
    torch.testing.assert_close(out, grouped_gemm_reference(x, ids, w, gu, dn) * 2)
    assert report()["calls"]["grouped_gemm"]["reference"] == 3


def test_switched_off_op_traces_as_plain_torch():
    x, ids, w, gu, dn = _args()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, ids, w: grouped_gemm(x, ids, w, gu, dn), fullgraph=True)
    torch.testing.assert_close(compiled(x, ids, w), grouped_gemm_reference(x, ids, w, gu, dn))
    assert report()["calls"]["grouped_gemm"] == {"pypto": 0, "reference": 0}
