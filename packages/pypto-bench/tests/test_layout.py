"""Issue 28's single-process layout: one home per concept, each public and checked.

config.py runs every rule once, protocol/ writes the (regime x arm) dispatch once, and the
pieces written two or three times before (the noise guard, the report's model section,
the remote-code refusal) each have one public function.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import pypto_bench
from pypto_bench import BadInputError, BenchConfig, ModelLoadError, TooManyRanksError, run_bench
from pypto_bench.config import ARMS, REGIMES, Arm, Regime
from pypto_bench.loading import refuse_remote_code
from pypto_bench.measure import summarize
from pypto_bench.noise import guard
from pypto_bench.protocol import RegimeProtocol, regime_for
from pypto_bench.report import ArmResult, Report, model_section


def _modules() -> list[str]:
    names = ["pypto_bench"]
    for info in pkgutil.walk_packages(pypto_bench.__path__, "pypto_bench."):
        if not info.name.endswith("__main__"):
            names.append(info.name)
    return names


@pytest.mark.parametrize("name", _modules())
def test_every_module_declares_all_and_every_listed_name_exists(name):
    module = importlib.import_module(name)
    assert hasattr(module, "__all__"), f"{name} has no __all__"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ lists undefined names {missing}"


def test_the_vocabularies_are_the_enums_values():
    assert ARMS == tuple(a.value for a in Arm) == ("eager", "graph", "pypto+graph", "hf-compile")
    assert REGIMES == tuple(r.value for r in Regime) == ("prefill", "decode", "diffusion-generate")
    # the old home still answers with the same values (pypto-tune and pypto-e2e read them)
    assert pypto_bench.ARMS == pypto_bench.bench.ARMS == ARMS
    assert pypto_bench.bench.BenchConfig is BenchConfig


@pytest.mark.parametrize("regime", REGIMES)
def test_regime_for_gives_one_protocol_per_regime(regime):
    proto = regime_for(BenchConfig(regime=regime))
    assert isinstance(proto, RegimeProtocol)
    assert proto.regime == regime
    assert regime_for(regime) is proto


def test_regime_for_refuses_an_unknown_regime_in_one_line():
    with pytest.raises(BadInputError, match=r"unknown regime 'encode': choose one of prefill"):
        regime_for("encode")


@dataclass
class _CountingConfig(BenchConfig):
    validations: int = 0

    def validate(self) -> None:
        self.validations += 1
        super().validate()


@pytest.mark.parametrize("placement", ["tensor", "pipeline"])
def test_a_multi_device_run_validates_its_config_once(tiny_llama, placement):
    """run_bench validates; the multi-device entry it hands over to does not validate again.
    64 ranks are more than this machine has: the run stops before anything launches."""
    config = _CountingConfig(
        model_path=str(tiny_llama),
        device="cpu",
        regime="prefill",
        arms=("eager",),
        nproc=64,
        placement=placement,
    )
    with pytest.raises(TooManyRanksError):
        run_bench(config)
    assert config.validations == 1


def test_the_placement_rules_run_inside_validate():
    config = BenchConfig(regime="decode", arms=("eager",), nproc=2, placement="pipeline")
    with pytest.raises(BadInputError, match="--placement pipeline measures the prefill regime"):
        config.validate()
    with pytest.raises(BadInputError, match="--rank-timeout must be finite"):
        BenchConfig(rank_timeout=float("inf")).validate()


def _arm(name: str, samples: list[float]) -> ArmResult:
    return ArmResult(name=name, tokens_per_s=summarize(samples))


def _report(arms: list[ArmResult]) -> Report:
    return Report("1.3", {}, "", [], {}, {}, "decode", arms=arms)


def test_noise_guard_assesses_each_batch_of_a_sweep_and_names_it():
    first = _report([_arm("eager", [10.0, 1.0, 1.0])])
    second = _report([_arm("eager", [5.0, 5.0, 5.0])])
    line = guard(first, None, batches=[(1, first), (8, second)])
    assert line is not None
    assert "spread at batch 1 / eager" in line
    assert first.warnings == [line]
    assert not any(c["holds"] for c in first.noise["checks"] if "batch 8" in c["where"])


def test_noise_guard_marks_the_scaling_of_an_arm_whose_baseline_is_noisy():
    report = _report([_arm("eager", [5.0, 5.0, 5.0])])
    baseline = _arm("eager", [10.0, 1.0, 1.0])
    line = guard(report, None, baselines=[baseline])
    assert line is not None
    assert "1-rank baseline / eager" in line
    assert report.arms[0].details["scaling_unreliable"].startswith("1-rank eager baseline: ")
    clean = _report([_arm("eager", [5.0, 5.0, 5.0])])
    assert guard(clean, None) is None
    assert clean.noise["noisy"] is False
    assert clean.warnings == []


def test_model_section_has_the_report_shape():
    model = torch.nn.Linear(3, 2)
    got = model_section(
        model, path=Path("/m"), model_type="llama", load_s=0.5, load_memory={"a": 1}
    )
    assert got == {
        "path": "/m",
        "class": "Linear",
        "model_type": "llama",
        "dtype": "float32",
        "parameters": 8,
        "load_s": 0.5,
        "load_memory": {"a": 1},
    }
    assert (
        model_section(model, path="/m", model_type=None, load_s=0, load_memory={}, parameters=16)[
            "parameters"
        ]
        == 16
    )


def test_remote_code_is_refused_without_the_flag_in_one_line(tmp_path):
    raw = {"model_type": "not_a_transformers_type", "auto_map": {"AutoConfig": "x.Y"}}
    with pytest.raises(ModelLoadError, match="ships its own code: rerun with --trust-remote-code"):
        refuse_remote_code(raw, tmp_path, False)
    refuse_remote_code(raw, tmp_path, True)
    refuse_remote_code({"model_type": "llama"}, tmp_path, False)
