"""The Gemma 4 plug-in: discovery, enable/undo, and the pypto+graph arm on a tiny folder."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from pypto_kernels_attention.package import PACKAGE
from pypto_kernels_attention.plugin import MARK, PLUGIN, Gemma4AttentionPlugin


@pytest.fixture(scope="module")
def tiny_gemma4(tmp_path_factory):
    from pypto_testing.gemma4 import make_tiny_gemma4

    return make_tiny_gemma4(tmp_path_factory.mktemp("gemma4") / "model")


@pytest.fixture(scope="module")
def model(tiny_gemma4):
    from transformers import AutoModelForImageTextToText

    m = AutoModelForImageTextToText.from_pretrained(
        tiny_gemma4, dtype=torch.float32, attn_implementation="eager"
    )
    return m.eval()


def _attn_modules(model):
    return [m for m in model.modules() if type(m).__name__ == "Gemma4TextAttention"]


def test_entry_point_finds_the_plugin_and_it_claims_gemma4(model):
    from pypto_bench.plugins import applicable_plugins

    assert [p.name for p in applicable_plugins(model)] == ["gemma4"]
    assert PLUGIN.applies_to(model)
    assert not PLUGIN.applies_to(torch.nn.Linear(2, 2))


def test_enable_on_another_model_is_a_one_line_error():
    with (
        pytest.raises(ValueError, match="not a Gemma 4 model"),
        PLUGIN.enable(torch.nn.Linear(2, 2)),
    ):
        pass


def test_unknown_layer_choice_is_refused():
    with pytest.raises(ValueError, match="use 'all' or 'sliding'"):
        Gemma4AttentionPlugin("odd")


def test_enable_routes_decode_and_undoes_everything_on_exit(model, monkeypatch):
    monkeypatch.setenv("PYPTO_ATTENTION_CPU_SIM", "0")  # count the routing, not the SIM
    mods = _attn_modules(model)
    before = {id(m.config): m.config._attn_implementation for m in mods}
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=3, do_sample=False)
        with PLUGIN.enable(model):
            assert all(getattr(m, MARK) for m in mods)
            assert {m.config._attn_implementation for m in mods} == {"pypto_gqa_decode+eager"}
            got = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert torch.equal(got, want)
    # two decode steps (the first token comes from the prefill) on every layer
    assert PACKAGE.stats.calls()["gqa_decode"]["reference"] >= 2 * len(mods)
    assert not any(hasattr(m, MARK) for m in mods)
    assert {id(m.config): m.config._attn_implementation for m in mods} == before
    assert not PACKAGE.switches.is_on("gqa_decode")


def test_sliding_only_covers_the_sliding_layers(model):
    plugin = Gemma4AttentionPlugin("sliding")
    with plugin.enable(model):
        marked = [m for m in _attn_modules(model) if getattr(m, MARK, False)]
    assert marked
    assert all(m.is_sliding for m in marked)
    assert len(marked) < len(_attn_modules(model))


@pytest.mark.slow(
    reason="the real pypto-bench run of a tiny Gemma 4: eager and pypto+graph with the "
    "PyPTO SIM attention kernel on every replay (~60 s here, 97 s in CI)"
)
def test_pypto_graph_arm_runs_the_kernel_on_every_replay(tiny_gemma4, pypto_cpu):
    from pypto_testing.bench import fused_arm_run

    gen = 3
    # No graph arm beside it: the plain graph arm of this folder's structure is proven
    # against transformers' generate in pypto-models-gemma4 (test_decode.py); here it
    # would only add a second compile of the step (docs/testing.md).
    arms = fused_arm_run(tiny_gemma4, gen=gen, arms=("eager", "pypto+graph"))
    for name in ("eager", "pypto+graph"):
        assert arms[name]["ok"], arms[name].get("error")
    fused = arms["pypto+graph"]
    assert fused["token_match"]["rate"] == 1.0, fused["token_match"]
    calls = fused["details"]["plugin_reports"]["gemma4"]["calls"]["gqa_decode"]
    layers = json.loads((tiny_gemma4 / "config.json").read_text())["text_config"][
        "num_hidden_layers"
    ]
    assert calls["reference"] == 0, fused["details"]["plugin_reports"]
    # every layer, every decode step that the captured graph replays
    assert calls["pypto"] > 0, calls
    assert calls["pypto"] % layers == 0, (calls, layers)
    assert calls["pypto"] // layers >= gen - 1, (calls, layers)
