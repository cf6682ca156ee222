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
    # The captured step's kernels are attributed to their modules (test_graphmap.py);
    # what runs outside the compiled graph (the step's own glue) stays "captured".
    assert graph_profile.meta["attribution"]["status"] == "ok"
    assert {"captured", "attention", "mlp"} <= {o.block for o in graph_profile.ops}


def test_profile_with_model_yields_a_profile_filled_on_exit():
    """What users write around their own code: module attribution, a Profile to advise."""
    from pypto_tune import Profile, advise
    from pypto_tune import profile as tune_profile

    model = _Two()
    x = torch.randn(2, 16)
    with tune_profile(model=model) as got:
        assert isinstance(got, Profile)
        assert got.ops == []  # filled when the block ends
        for _ in range(3):
            model(x)
    assert got.step["count"] == 3
    assert got.step_us > 0
    assert ("aten::addmm", "layers.1") in {(o.name, o.module) for o in got.ops}
    assert got.blocks["norm"]["us"] > 0
    assert got.meta["model"]["class"] == "_Two"
    assert got.trace is not None
    assert {c["module"] for c in got.call_graph} >= {"layers.0", "layers.1", "norm"}
    assert advise(got) is got
    assert all("forward" not in m.__dict__ for m in model.modules())  # scopes removed
    model(x)  # and the model runs as before


def test_profile_with_model_detaches_when_the_block_raises():
    from pypto_tune import profile as tune_profile

    model = _Two()

    def fails() -> None:
        with tune_profile(model=model):
            model(torch.randn(2, 16))
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        fails()
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert not model._forward_pre_hooks


def test_advise_and_diagnose_name_what_to_pass():
    from pypto_tune import advise, compare_profiles, diagnose

    with profile(device="cpu") as raw:  # the raw collection, not a Profile
        _Two()(torch.randn(1, 16))
    for call, arg in ((advise, raw), (diagnose, raw), (advise, {"meta": {}}), (diagnose, None)):
        with pytest.raises(TypeError, match=r"takes a pypto_tune\.Profile") as info:
            call(arg)
        assert "profile_model()" in str(info.value)
    with pytest.raises(TypeError, match=r"profile\(model=\.\.\.\) yields a Profile"):
        advise(raw)
    with tune_profile_of(_Two()) as prof:
        pass
    with pytest.raises(TypeError, match="Thresholds"):
        diagnose(prof, {"norm_share": 1})
    with pytest.raises(TypeError, match="compare_profiles"):
        compare_profiles(prof, raw)
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        tune_profile_of("model")


def tune_profile_of(model):
    from pypto_tune import profile as tune_profile

    return tune_profile(model=model)


def test_detail_without_decodable_stacks_profiles_again_without_them(tmp_path):
    """A Python frame whose file name is not UTF-8 makes torch.profiler's stack collection
    raise inside the step (a real failure, not a stand-in): the profile is taken again
    without stacks and says so, instead of being lost."""
    import importlib.util
    import os

    from pypto_tune import profile_step

    folder = os.fsencode(tmp_path) + b"/mod\xff\xfe"
    os.mkdir(folder)
    source = folder + b"/odd_name.py"
    with open(source, "wb") as fh:
        fh.write(b"import torch\n\ndef run(x):\n    return torch.mm(x, x)\n")
    spec = importlib.util.spec_from_file_location("odd_name", os.fsdecode(source))
    odd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(odd)
    x = torch.randn(8, 8)
    # The failure is real: stacks on, the step raises.
    with pytest.raises(RuntimeError), torch.profiler.profile(with_stack=True):
        odd.run(x)
    prof = profile_step(lambda: odd.run(x), level="detail", iters=2, warmup=0, peaks=False)
    assert prof.meta["stacks"] is False
    assert any("Python stacks were not recorded" in w for w in prof.warnings)
    mm = next(o for o in prof.ops if o.name == "aten::mm")
    assert mm.calls == pytest.approx(1.0)
    assert mm.shapes == [[8, 8], [8, 8]]  # the rest of detail is there
    clean = profile_step(lambda: torch.mm(x, x), level="detail", iters=1, warmup=0, peaks=False)
    assert clean.meta["stacks"] is True
    assert not any("stacks" in w for w in clean.warnings)


def test_the_hf_compile_arm_is_profiled_per_token_not_per_generate(tiny_llama, eager_profile):
    """Issue #45, item 1: the hf-compile arm (transformers' generate with a compiled
    forward) recorded no step marks, so whole generate calls were reported as "decode step
    (one token)" and `compare eager hf-compile` said 0.01x. Its steps are now its compiled
    forward calls: one per generated token, each near the eager step, not 16 of them."""
    from pypto_bench import BenchConfig
    from pypto_tune import compare_profiles, profile_model

    config = BenchConfig(model_path=str(tiny_llama), device="cpu", regime="decode", seq=8, gen=16)
    prof = profile_model(config, arm="hf-compile", level="light", iters=2)
    step = prof.step
    assert prof.step_us > 0
    assert any("compiled forward calls" in w for w in prof.warnings), prof.warnings
    # 15 decode tokens per generate (the first token comes from the prefill), two iterations
    assert 2 * 10 <= len(step.get("time_us", {}).get("samples", [])) <= 2 * 16, step
    # a step is one token's forward: within a small factor of eager's, never a whole call
    assert prof.step_us < 5 * eager_profile.step_us, (prof.step_us, eager_profile.step_us)
    c = compare_profiles(eager_profile, prof)
    assert c["opt"]["step_us"] == prof.step_us
