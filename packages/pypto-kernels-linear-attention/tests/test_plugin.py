"""The pypto.kernels plug-in on tiny folders of every hybrid family with these layers
(built with transformers' own classes: Gated DeltaNet + gated attention, with and without
MoE, and KDA + MLA + MoE), eagerly and through the bench's pypto+graph arm."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest
import torch

from pypto_kernels_linear_attention import PACKAGE, PLUGIN, fitting_layers

pytest.importorskip("transformers")

#: model type -> the layer kind the plug-in finds (one linear-attention layer each).
FAMILIES = {
    "qwen3_next": "qkvz",
    "qwen3_5_text": "qkv",
    "qwen3_5_moe_text": "qkv",
    "kimi_linear": "kda",
}


@pytest.fixture(scope="session")
def folders(tmp_path_factory):
    from pypto_testing.architectures import available, make_tiny_architecture

    root = tmp_path_factory.mktemp("hybrids")
    out = {}
    for model_type in FAMILIES:
        if available(model_type) is None:
            out[model_type] = make_tiny_architecture(root / model_type, model_type)
    return out


def _folder(folders, model_type):
    if model_type not in folders:
        from pypto_testing.architectures import available

        pytest.skip(available(model_type) or model_type)
    return folders[model_type]


def _load(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder)).eval()


def test_entry_point_names_the_plugin():
    eps = importlib.metadata.entry_points(group="pypto.kernels")
    assert any(ep.name == "linear_attention" and ep.load() is PLUGIN for ep in eps)


def test_applies_to_linear_attention_layers_only(folders, tmp_path):
    from pypto_testing.models import make_tiny_model

    for model_type, kind in FAMILIES.items():
        model = _load(_folder(folders, model_type))
        assert PLUGIN.applies_to(model), model_type
        assert [k for _, _, k in fitting_layers(model)] == [kind], model_type
    dense = _load(make_tiny_model(tmp_path / "llama"))
    assert not PLUGIN.applies_to(dense)
    with pytest.raises(ValueError, match="no Gated DeltaNet or KDA layer"), PLUGIN.enable(dense):
        pass


def test_a_layer_with_another_gate_is_left_alone(folders):
    model = _load(_folder(folders, "qwen3_5_text"))
    ((_, layer, _),) = fitting_layers(model)
    layer.norm.activation = "sigmoid"  # not the SiLU-gated norm the kernel computes
    assert not PLUGIN.applies_to(model)


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "qwen3_5_moe_text", "kimi_linear"])
def test_greedy_tokens_equal_eager_with_the_kernel_on_every_decode_step(
    folders, model_type, pypto_cpu
):
    """Eager generate: the decode steps of every linear-attention layer run the kernel
    (prefill stays the layer's own), tokens equal the model's own; exit restores it."""
    model = _load(_folder(folders, model_type))
    ids = torch.tensor([[5, 9, 14, 20, 33, 41]])
    layers = [m for _, m, _ in fitting_layers(model)]
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False)
        with PLUGIN.enable(model):
            assert all("forward" in vars(m) for m in layers)
            got = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert all("forward" not in vars(m) for m in layers)
    assert got.tolist() == want.tolist()
    op = "kda_step" if FAMILIES[model_type] == "kda" else "gated_delta_step"
    # 6 new tokens: the first from the prefill, 5 decode steps, one layer
    assert PLUGIN.report()["calls"][op] == {"pypto": 5, "reference": 0}


def test_switched_off_inside_enable_the_reference_decodes_the_same(folders):
    model = _load(_folder(folders, "kimi_linear"))
    ids = torch.tensor([[7, 8, 9]])
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=4, do_sample=False)
        with PLUGIN.enable(model):
            PACKAGE.switches.set_switch("kda_step", False)
            got = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert got.tolist() == want.tolist()
    assert PLUGIN.report()["calls"]["kda_step"] == {"pypto": 0, "reference": 3}


def _fused(folder, gen, tmp_path):
    """eager and pypto+graph through the real ``pypto-bench run`` in its own process (CPU,
    fp32, no warmup, one iteration): the compiled graphs and PyPTO's state end with it, not
    in this test process. Returns the plug-in's call counts from the report."""
    report = tmp_path / f"r{gen}.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pypto_bench.cli",
            "run",
            "--model-path",
            str(folder),
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--regime",
            "decode",
            "--seq",
            "4",
            "--gen",
            str(gen),
            "--warmup",
            "0",
            "--iters",
            "1",
            "--arms",
            "eager,pypto+graph",
            "--no-bandwidth",
            "--no-progress",
            "--report-file",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert report.is_file(), done.stderr[-3000:]
    arms = {a["name"]: a for a in json.loads(report.read_text())["arms"]}
    for name in ("eager", "pypto+graph"):
        assert arms[name]["ok"], arms[name].get("error")
    fused = arms["pypto+graph"]
    assert "linear_attention" in fused["details"]["plugins"]
    assert fused["token_match"]["rate"] == 1.0, fused["token_match"]
    assert fused["token_match"]["compared"] == gen
    return fused["details"]["plugin_reports"]["linear_attention"]["calls"]


@pytest.mark.slow(
    reason="the real pypto-bench CLI in a child process: graph and pypto+graph compiles of a "
    "hybrid with the SIM kernel inside (~80 s on 2 busy cores)"
)
def test_bench_pypto_graph_arm_runs_the_kernel_on_every_replay(folders, tmp_path):
    """eager and pypto+graph through pypto-bench: tokens equal eager, no fallback, and the
    kernel count grows with the decode steps (one layer): the captured step runs the op
    on every replay, not once at capture."""
    pytest.importorskip("pypto")
    folder = _folder(folders, "qwen3_5_text")
    counts = {}
    for gen in (2, 4):
        calls = _fused(folder, gen, tmp_path)["gated_delta_step"]
        assert calls["reference"] == 0, json.dumps(calls)
        counts[gen] = calls["pypto"]
    assert counts[4] - counts[2] >= 2, counts


@pytest.mark.slow(
    reason="the real pypto-bench CLI in a child process: a pypto+graph compile of a KDA or "
    "Gated DeltaNet + MoE hybrid with the SIM kernel inside (63-66 s in a two-worker run, 92 s "
    "with other work on the machine)"
)
@pytest.mark.parametrize(
    ("model_type", "op"),
    [
        ("kimi_linear", "kda_step"),
        ("qwen3_next", "gated_delta_step"),
    ],
)
def test_bench_pypto_graph_arm_on_the_other_hybrids(folders, model_type, op, tmp_path):
    """KDA + MLA + MoE and Qwen3-Next's Gated DeltaNet + MoE (the linear-attention and MoE
    plug-ins together): tokens equal eager, the step kernel on every decode step (3 new
    tokens: at least 2 decode steps of the one layer), no fallback. Qwen3.5-MoE's layers
    are Qwen3.5's (benched above); its eager decode runs the kernel in the test above."""
    pytest.importorskip("pypto")
    calls = _fused(_folder(folders, model_type), 3, tmp_path)[op]
    assert calls["reference"] == 0, calls
    assert calls["pypto"] >= 2, calls
