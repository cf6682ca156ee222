"""The loop closes: the top recommendation, applied and re-profiled, gives a measured
speedup within 2x of its estimate (tiny Llama, decode, CPU)."""

from __future__ import annotations

import pytest
from constructed import make_profile, matmul_op

from pypto_tune import BadInputError, NotComparableError, advise, compare_profiles


def test_prediction_check_on_known_timings():
    """The verdict's arithmetic on constructed profiles: an estimate of 2x against a
    measured 1.6x is within the 2x tolerance; against a measured 8x it missed."""
    import copy

    base = make_profile([matmul_op(64, 64, 64, us=200.0)], step_us=1000.0)
    advise(base)
    rec = next(r for r in base.recommendations if r["id"] == "graph_arm")
    rec["estimated_speedup"] = 2.0
    for opt_us, factor, verdict in ((625.0, 1.25, True), (125.0, 4.0, False)):
        opt = copy.deepcopy(base)
        opt.meta["arm"] = "graph"
        opt.step["time_us"]["mean"] = opt_us
        check = next(
            c for c in compare_profiles(base, opt)["predictions"] if c["id"] == "graph_arm"
        )
        assert check["measured"] == pytest.approx(1000.0 / opt_us)
        assert check["factor"] == pytest.approx(factor)
        assert check["came_true"] is verdict
        assert compare_profiles(base, opt, tolerance=5.0)["predictions"][0]["came_true"]
    for bad in (float("nan"), float("inf"), 0.5):
        with pytest.raises(BadInputError, match="finite factor >= 1"):
            compare_profiles(base, opt, tolerance=bad)


def test_the_loop_on_a_real_model_at_any_speed(eager_profile, graph_profile):
    """Eager vs graph on the tiny Llama: the recommendation that the host gap produced
    is the one compare checks, against the measured ratio (the ratio itself depends on
    the machine's load, so only its consistency is asserted)."""
    result = compare_profiles(eager_profile, graph_profile)
    ratio = result["noise"]["time_ratio"]
    if ratio:  # the headline is the statistic its interval is of: medians of the steps
        assert result["step_speedup"] == pytest.approx(1 / ratio["median"])
    else:
        assert result["step_speedup"] == pytest.approx(
            eager_profile.step_us / graph_profile.step_us
        )
    ids = [r["id"] for r in eager_profile.recommendations]
    assert ("graph_arm" in ids) == any(f["fix"] == "graph_arm" for f in eager_profile.findings)
    checked = {c["id"]: c for c in result["predictions"]}
    for rec in eager_profile.recommendations:
        if rec.get("applies_when", {}).get("arm") and "graph" in rec["applies_when"]["arm"]:
            check = checked[rec["id"]]
            assert check["measured"] == pytest.approx(result["step_speedup"])
            if rec.get("estimated_speedup"):
                assert check["came_true"] == (check["factor"] <= 2.0)
    if "graph_arm" in ids:
        graph = next(r for r in eager_profile.recommendations if r["id"] == "graph_arm")
        assert "--arms eager,graph" in graph["command"]
        assert "--arm graph" in graph["verify"]


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
    assert result["blocks"]["attention"]["opt_us"] > 0  # attributed inside the graph
    assert result["ops"]
    assert all("delta_us" in o for o in result["ops"])
