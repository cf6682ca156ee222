"""Non-finite logits fail an arm, always: the argmax of NaN is a token too, so a model that
computes NaN "matched" itself token for token and its graph arm's ratio was quoted."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("transformers")

from pypto_bench import EXIT, BenchConfig, run_bench
from pypto_bench.cli import main


@pytest.fixture(scope="module")
def nan_model(tiny_llama, tmp_path_factory):
    """The tiny Llama with one NaN in its final norm: every logit is NaN."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("nan") / "m"
    shutil.copytree(tiny_llama, folder)
    weights = load_file(str(folder / "model.safetensors"))
    weights["model.norm.weight"][0] = float("nan")
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_nan_logits_fail_the_eager_arm_and_every_other(nan_model):
    report = run_bench(
        BenchConfig(model_path=str(nan_model), device="cpu", seq=6, gen=4, warmup=0, iters=1,
                    arms=("eager", "graph"), graph_backend="eager", measure_bandwidth=False)
    )  # fmt: skip
    eager, graph = report.arm("eager"), report.arm("graph")
    assert not eager.ok
    assert "NonFiniteLogitsError" in eager.error
    assert "NaN" in eager.error
    assert not graph.ok  # its tokens were the argmax of NaN: not comparable
    assert "not comparable" in graph.error
    assert report.ok is False


def test_the_cli_exits_arm_failed(nan_model, capsys):
    code = main(["run", "--model-path", str(nan_model), "--device", "cpu", "--seq", "6",
                 "--gen", "4", "--warmup", "0", "--iters", "1", "--arms", "eager",
                 "--no-bandwidth", "--no-progress"])  # fmt: skip
    assert code == EXIT.ARM_FAILED
    assert "NaN" in capsys.readouterr().err


def test_nan_logits_fail_every_prefill_arm(nan_model):
    report = run_bench(
        BenchConfig(model_path=str(nan_model), device="cpu", regime="prefill", seq=6,
                    warmup=0, iters=1, arms=("eager", "graph"), graph_backend="eager",
                    measure_bandwidth=False)
    )  # fmt: skip
    for arm in report.arms:
        assert not arm.ok, arm.name
        assert "NonFiniteLogitsError" in arm.error


def test_the_step_watch_flags_nan_and_plus_inf_but_not_a_processor_s_minus_inf():
    import torch

    from pypto_bench.protocol.decode import FirstLogitsStamp

    def flagged(value: float) -> bool:
        stamp = FirstLogitsStamp("cpu", lambda _d: None)
        scores = torch.randn(2, 50)
        scores[1, 3] = value
        stamp(None, scores)
        return bool(stamp.nonfinite)

    assert flagged(float("nan"))
    assert flagged(float("inf"))
    assert not flagged(float("-inf"))  # min_new_tokens bans EOS this way
