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


def test_v2_policy_carries_aclgraph_and_the_expected_change_with_its_source(tmp_path):
    path = tmp_path / "p.json"
    rule = {
        "max_batch": None,
        "switches": {"swiglu_mlp": True},
        "use_acl_graph": True,
        "expected_change_pct": 3.25,
        "expected_source": "cost model, batch 1",
        "reason": "measured",
    }
    path.write_text(json.dumps({"schema_version": 2, "rules": [rule]}))
    d = pk.DynamicPTOConfig.from_json(path).for_batch(7)
    assert (d.use_acl_graph, d.expected_change_pct) == (True, 3.25)
    assert d.to_dict()["expected_source"] == "cost model, batch 1"
    assert d.line() == (
        "batch 7: rms_norm=off mrope=off swiglu_mlp=on; aclgraph on; "
        "expected change +3.2% (cost model, batch 1); reason: measured"
    )
    # A v1 file (no such fields) still loads; it says it carries no measurement.
    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps({"schema_version": 1, "rules": [{"max_batch": None, "reason": "r"}]}))
    d1 = pk.DynamicPTOConfig.from_json(v1).for_batch(1)
    assert d1.use_acl_graph is None
    assert d1.expected_change_pct is None
    assert "aclgraph not set by the policy; expected change unknown (not measured" in d1.line()


@pytest.mark.parametrize(
    ("doc", "msg"),
    [
        ({"schema_version": 3, "rules": []}, "schema_version 2"),
        ({"schema_version": 2, "rules": {}}, "'rules' must be a list"),
        (
            {
                "schema_version": 2,
                "rules": [{"max_batch": None, "use_acl_graph": "yes", "reason": "x"}],
            },
            "use_acl_graph must be true, false or null",
        ),
        (
            {
                "schema_version": 2,
                "rules": [{"max_batch": None, "expected_change_pct": "5%", "reason": "x"}],
            },
            "expected_change_pct must be a number",
        ),
        (
            {"schema_version": 2, "rules": [{"max_batch": True, "reason": "x"}]},
            "positive",
        ),
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


def test_plugin_report_covers_its_own_enable_only():
    """A bench arm's plug-in report must not count calls made before it (other tests, arms)."""
    from pypto_kernels_gutenocr import stats

    class Marked(torch.nn.Module):
        pypto_kernel_family = "gutenocr"

    stats.record_fallback("rms_norm", "an earlier run's fallback")
    assert PLUGIN.report()["calls"]["rms_norm"]["reference"] >= 1
    with PLUGIN.enable(Marked()):
        assert PLUGIN.report()["calls"]["rms_norm"]["reference"] == 0
    assert "rms_norm" not in PLUGIN.report()["fallback_reasons"]
