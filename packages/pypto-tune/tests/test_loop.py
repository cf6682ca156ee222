"""The loop closes: the top recommendation, applied and re-profiled, gives a measured
speedup within 2x of its estimate (tiny Llama, decode, CPU)."""

from __future__ import annotations

import pytest

from pypto_tune import NotComparableError, compare_profiles


def test_top_recommendation_comes_true_within_2x(eager_profile, graph_profile):
    top = eager_profile.recommendations[0]
    assert top["id"] == "graph_arm"
    assert top["command"].startswith("pypto-bench run ")
    assert "--arms eager,graph" in top["command"]
    assert "--arm graph" in top["verify"]
    result = compare_profiles(eager_profile, graph_profile)
    check = next(c for c in result["predictions"] if c["id"] == "graph_arm")
    assert check["measured"] == pytest.approx(eager_profile.step_us / graph_profile.step_us)
    assert check["came_true"], (check, top["basis"])
    assert check["factor"] <= 2.0
    assert result["step_speedup"] > 1.5  # capture is much faster on a tiny model


def test_compare_refuses_different_shapes(eager_profile, graph_profile):
    import copy

    other = copy.deepcopy(graph_profile)
    other.meta["gen"] = 999
    with pytest.raises(NotComparableError, match="gen"):
        compare_profiles(eager_profile, other)


def test_compare_names_unknown_applied_ids(eager_profile, graph_profile):
    with pytest.raises(NotComparableError, match="no recommendation nope"):
        compare_profiles(eager_profile, graph_profile, applied=["nope"])


def test_compare_block_and_op_diff(eager_profile, graph_profile):
    result = compare_profiles(eager_profile, graph_profile)
    assert result["blocks"]["captured"]["base_us"] == 0.0
    assert result["blocks"]["captured"]["opt_us"] > 0
    assert result["blocks"]["attention"]["opt_us"] == 0.0
    assert result["ops"]
    assert all("delta_us" in o for o in result["ops"])
