"""The shipped batch policy is what the shipped cost-model data derives (by a command)."""

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

import pypto_kernels_gutenocr as pk
from pypto_kernels_gutenocr.policy import (
    CALLS_PER_STEP,
    DATA_RESOURCE,
    POLICY_RESOURCE,
    derive_policy,
    policy_table,
    render_policy,
)

ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "gutenocr_policy.py"
BATCHES = [1, 2, 4, 8, 16, 32, 64]


def _resource(name: str) -> str:
    return (resources.files("pypto_kernels_gutenocr") / name).read_text()


def test_committed_policy_equals_what_the_committed_data_derives():
    data = json.loads(_resource(DATA_RESOURCE))
    assert _resource(POLICY_RESOURCE) == render_policy(derive_policy(data))


def test_the_data_covers_every_op_at_every_batch_at_the_real_shapes():
    data = json.loads(_resource(DATA_RESOURCE))
    assert data["shape"]["hidden"] == 2048
    assert data["shape"]["inter"] == 11008
    seen = {(r["op"], r["batch"]) for r in data["rows"]}
    assert seen == {(op, b) for op in CALLS_PER_STEP for b in BATCHES}
    for r in data["rows"]:
        assert r["fused_us"] > 0
        assert r["unfused_us"] > 0
        assert r["cpu_reference_ms"] > 0


def test_the_default_config_is_the_measured_policy_with_sourced_expectations():
    cfg = pk.DynamicPTOConfig.default()
    assert cfg.source.endswith(POLICY_RESOURCE)
    for b in (1, 3, 64, 500):
        d = cfg.for_batch(b)
        assert d.expected_change_pct is not None
        assert DATA_RESOURCE in d.expected_source
        assert "measured at batch" in d.reason


def test_derive_switches_an_op_on_only_where_its_fused_kernel_saves():
    rows = [
        {"op": "rms_norm", "batch": 1, "fused_us": 10.05, "unfused_us": 10.05},  # equal: off
        {"op": "mrope", "batch": 1, "fused_us": 30.0, "unfused_us": 20.0},  # slower: off
        {"op": "swiglu_mlp", "batch": 1, "fused_us": 90.0, "unfused_us": 100.0},
    ]
    rows = [{**r, "cpu_reference_ms": 1.0} for r in rows]
    policy = derive_policy({"rows": rows})
    (rule,) = policy["rules"]
    assert rule["max_batch"] is None
    assert rule["switches"] == {"rms_norm": False, "mrope": False, "swiglu_mlp": True}
    before = 73 * 10.05 + 36 * 20.0 + 36 * 100.0
    after = 73 * 10.05 + 36 * 20.0 + 36 * 90.0
    assert rule["expected_change_pct"] == round(100 * (before / after - 1), 2)
    assert "| 1 |" in policy_table({"rows": rows})
    with pytest.raises(ValueError, match="no data for"):
        derive_policy({"rows": rows[:2]})


def test_the_command_checks_and_regenerates_the_policy(tmp_path):
    ok = subprocess.run(
        [sys.executable, str(TOOL), "derive", "--check"], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    stale = tmp_path / "policy.json"
    stale.write_text(
        _resource(POLICY_RESOURCE).replace('"use_acl_graph": true', '"use_acl_graph": false')
    )
    bad = subprocess.run(
        [sys.executable, str(TOOL), "derive", "--check", "--out", str(stale)],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert "differs" in bad.stderr
    regen = subprocess.run(
        [sys.executable, str(TOOL), "derive", "--out", str(stale), "--table"],
        capture_output=True,
        text=True,
    )
    assert regen.returncode == 0, regen.stderr
    assert stale.read_text() == _resource(POLICY_RESOURCE)
    assert regen.stdout.startswith("| batch |")


def test_measure_one_op_in_the_cost_model():
    """The measuring path itself (RMSNorm only: cheap), fused vs unfused kernels."""
    pytest.importorskip("pypto")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gutenocr_policy
    finally:
        sys.path.remove(str(ROOT / "tools"))
    from pypto_kernels_gutenocr import costmodel

    if costmodel.availability():
        pytest.skip(costmodel.availability())
    row = gutenocr_policy.measure_op("rms_norm", 2, costmodel.cost_backend())
    assert row["fused_us"] > 0
    assert len(row["unfused_parts_us"]) == 2
    assert row["unfused_us"] == pytest.approx(sum(row["unfused_parts_us"]), abs=0.01)
