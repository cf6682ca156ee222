import json
from importlib.metadata import entry_points

import pytest
import torch

import pypto_kernels_gutenocr as pk
from pypto_kernels_gutenocr.plugin import PLUGIN


def test_seed_policy_is_the_default_and_says_it_is_unmeasured():
    cfg = pk.DynamicPTOConfig()
    small, big = cfg.for_batch(4), cfg.for_batch(5)
    assert small.switches == {"rms_norm": False, "mrope": True, "swiglu_mlp": True}
    assert big.switches == {"rms_norm": False, "mrope": False, "swiglu_mlp": True}
    assert "unmeasured" in small.reason
    with cfg.apply(2) as decision:
        assert pk.USE_PTO_MROPE
        assert pk.USE_PTO_SWIGLU_MLP
        assert not pk.USE_PTO_RMS_NORM
        assert decision.batch == 2
    assert not pk.USE_PTO_MROPE


def test_policy_loads_from_json(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "rules": [
                    {
                        "max_batch": 1,
                        "switches": {"USE_PTO_RMS_NORM": True},
                        "reason": "measured: b1",
                    },
                    {"max_batch": None, "switches": {}, "reason": "measured: nothing helps"},
                ],
            }
        )
    )
    cfg = pk.DynamicPTOConfig.from_json(path)
    assert cfg.for_batch(1).switches["rms_norm"]
    assert cfg.for_batch(1).reason == "measured: b1"
    assert not any(cfg.for_batch(8).switches.values())
    assert cfg.to_dict()["source"] == str(path)


@pytest.mark.parametrize(
    ("doc", "msg"),
    [
        ({"schema_version": 2, "rules": []}, "schema_version 1"),
        (
            {"schema_version": 1, "rules": [{"max_batch": 4, "switches": {}, "reason": "x"}]},
            "last rule",
        ),
        (
            {
                "schema_version": 1,
                "rules": [{"max_batch": None, "switches": {"flash": True}, "reason": "x"}],
            },
            "unknown op",
        ),
        (
            {"schema_version": 1, "rules": [{"max_batch": 0, "switches": {}, "reason": "x"}]},
            "positive",
        ),
    ],
)
def test_bad_policy_files_name_the_problem(tmp_path, doc, msg):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(pk.PolicyError, match=msg):
        pk.DynamicPTOConfig.from_json(path)


def test_plugin_is_registered_for_pypto_bench():
    eps = [ep for ep in entry_points(group="pypto.kernels") if ep.name == "gutenocr"]
    assert len(eps) == 1
    assert eps[0].load() is PLUGIN
    assert PLUGIN.name == "gutenocr"


def test_plugin_claims_only_marked_models_and_switches_everything_inside_enable():
    plain = torch.nn.Linear(2, 2)
    assert not PLUGIN.applies_to(plain)

    class Marked(torch.nn.Module):
        pypto_kernel_family = "gutenocr"

    model = Marked()
    assert PLUGIN.applies_to(model)
    with PLUGIN.enable(model):
        assert all(PLUGIN.report()["switches"].values())
    rep = PLUGIN.report()
    assert not any(rep["switches"].values())
    assert set(rep) == {"switches", "calls", "fallback_reasons"}
    json.dumps(rep)
    with pytest.raises(ValueError, match="not a GutenOCR model"), PLUGIN.enable(plain):
        pass
