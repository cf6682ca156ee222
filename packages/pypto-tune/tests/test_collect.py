"""Collection: the profiler session, module attribution, steps, light vs detail."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pypto_tune import BadInputError, ModuleScopes, profile, summarize
from pypto_tune.collect import ITERATION_MARKER


class _Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def test_context_manager_attributes_each_operator_to_its_module():
    model = _Two()
    x = torch.randn(2, 16)
    with ModuleScopes(model, prefill_marks=False) as scopes, profile(device="cpu") as got:
        for _ in range(3):
            model(x)
    prof = summarize(got.trace, regime="prefill", classes=scopes.classes)
    assert prof.step["count"] == 3
    places = {(o.name, o.module) for o in prof.ops}
    assert ("aten::addmm", "layers.0") in places
    assert ("aten::addmm", "layers.1") in places
    assert any(o.module == "norm" and o.block == "norm" for o in prof.ops)
    layer0 = next(o for o in prof.ops if o.name == "aten::addmm" and o.module == "layers.0")
    assert layer0.calls == pytest.approx(1.0)
    assert layer0.layer == 0
    assert layer0.shapes is None  # light: no shapes
    graph = {c["module"]: c for c in prof.call_graph}
    assert graph["layers.0"]["parent"] == "layers"
    assert graph["<model>"]["class"] == "_Two"


def test_detail_records_shapes_and_flops():
    model = _Two()
    x = torch.randn(2, 16)
    with (
        ModuleScopes(model, prefill_marks=False) as scopes,
        profile(level="detail", device="cpu") as got,
    ):
        model(x)
    prof = summarize(got.trace, regime="prefill", classes=scopes.classes)
    mm = next(o for o in prof.ops if o.name == "aten::addmm")
    assert mm.shapes[1] == [2, 16]
    assert mm.flops == pytest.approx(2 * 2 * 16 * 16)


def test_decorator_keeps_the_last_trace():
    model = _Two()

    @profile(level="light", device="cpu")
    def step(x: torch.Tensor) -> torch.Tensor:
        return model(x)

    out = step(torch.randn(2, 16))
    assert out.shape == (2, 16)
    trace = step.last
    assert trace is not None
    assert any(s.name == ITERATION_MARKER for s in trace.steps)
    assert any(e.name == "aten::addmm" for e in trace.events)


def test_prefill_forward_is_not_a_decode_step():
    model = _Two()
    with ModuleScopes(model) as scopes, profile(level="light", device="cpu") as got:
        model(torch.randn(1, 5, 16))  # a prompt: 5 positions
        for _ in range(4):
            model(torch.randn(1, 1, 16))  # decode steps
    prof = summarize(got.trace, regime="decode", classes=scopes.classes)
    assert prof.step["count"] == 4


def test_hooks_cost_nothing_outside_a_profile_and_are_removed():
    model = _Two()
    scopes = ModuleScopes(model).attach()
    model(torch.randn(1, 16))  # no profiler: hooks push placeholders only
    assert scopes._stack == []
    scopes.detach()
    assert not model._forward_hooks
    assert not model._forward_pre_hooks
    assert all("forward" not in m.__dict__ for m in model.modules())  # wrappers removed


def test_bad_level_and_device():
    with pytest.raises(BadInputError, match="light or detail"):
        profile(level="loud")
    from pypto_tune import EnvironmentMissingError

    with pytest.raises(EnvironmentMissingError), profile(level="light", device="meta"):
        pass


def test_captured_decode_steps_are_marked_by_pypto_capture(graph_profile):
    # gen 16 -> 15 replays per iteration, 3 iterations.
    assert graph_profile.step["count"] == 45
    assert graph_profile.meta["arm_details"]["backend"] == "compile"
    assert {o.block for o in graph_profile.ops} == {"captured"}
