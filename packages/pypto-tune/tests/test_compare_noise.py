"""`pypto-tune compare` says when a difference is inside the noise (issue 31): the step
time's opt/base ratio gets an interval from its per-step samples, and each block and
operator delta a verdict against that noise band. Profiles are constructed, so each
verdict is known in advance."""

from __future__ import annotations

import json
from pathlib import Path

from constructed import make_profile, matmul_op

from pypto_tune import EXIT, Profile, write_profile
from pypto_tune.cli import main
from pypto_tune.compare import NO_SAMPLES, compare_profiles, comparison_markdown


def _with_samples(us: float, steps: list[float], op_us: float) -> Profile:
    p = make_profile([matmul_op(8, 64, 64, us=op_us)], step_us=us)
    p.step["time_us"]["samples"] = steps
    return p


def _jitter(center: float, spread: float, n: int = 12) -> list[float]:
    return [center + spread * ((i * 7) % n - n / 2) / n for i in range(n)]


def test_faster_when_the_intervals_part():
    base = _with_samples(1000.0, _jitter(1000.0, 20.0), op_us=600.0)
    opt = _with_samples(700.0, _jitter(700.0, 20.0), op_us=300.0)
    c = compare_profiles(base, opt)
    assert c["noise"]["verdict"] == "faster"
    assert c["noise"]["time_ratio"]["high"] < 1.0
    assert c["blocks"]["mlp"]["verdict"] == "faster"
    assert c["ops"][0]["verdict"] == "faster"
    md = comparison_markdown(c)
    assert "**faster**" in md
    # The step's speedup is printed with its interval (the time ratio's, inverted).
    r = c["noise"]["time_ratio"]
    assert f"{c['step_speedup']:.2f}x [{1 / r['high']:.2f}, {1 / r['low']:.2f}]" in md


def test_slower_when_opt_is_slower_throughout():
    base = _with_samples(700.0, _jitter(700.0, 20.0), op_us=300.0)
    opt = _with_samples(1000.0, _jitter(1000.0, 20.0), op_us=600.0)
    c = compare_profiles(base, opt)
    assert c["noise"]["verdict"] == "slower"
    assert c["noise"]["time_ratio"]["low"] > 1.0
    assert c["blocks"]["mlp"]["verdict"] == "slower"


def test_within_noise_when_the_difference_is_smaller_than_the_spread():
    # 1% apart, steps spread +/-30%: the interval straddles 1.
    base = _with_samples(1000.0, _jitter(1000.0, 600.0), op_us=500.0)
    opt = _with_samples(990.0, _jitter(990.0, 600.0), op_us=495.0)
    c = compare_profiles(base, opt)
    assert c["noise"]["verdict"] == "within noise"
    lo, hi = c["noise"]["time_ratio"]["low"], c["noise"]["time_ratio"]["high"]
    assert lo <= 1.0 <= hi
    assert c["blocks"]["mlp"]["verdict"] == "within noise"
    assert "| within noise |" in comparison_markdown(c)


def test_totals_only_profiles_say_no_interval_can_be_formed():
    base = make_profile([matmul_op(8, 64, 64, us=600.0)], step_us=1000.0)
    opt = make_profile([matmul_op(8, 64, 64, us=300.0)], step_us=700.0)
    c = compare_profiles(base, opt)
    assert c["noise"]["verdict"] is None
    assert c["noise"]["why"] == NO_SAMPLES
    assert c["blocks"]["mlp"]["verdict"] is None
    md = comparison_markdown(c)
    assert "no interval can be formed" in md
    assert "| no interval |" in md
    assert "x (no interval: see Noise)" in md


def test_cli_json_carries_the_verdicts(tmp_path: Path, capsys):
    base = _with_samples(1000.0, _jitter(1000.0, 20.0), op_us=600.0)
    opt = _with_samples(700.0, _jitter(700.0, 20.0), op_us=300.0)
    a, b = write_profile(base, tmp_path / "a.json"), write_profile(opt, tmp_path / "b.json")
    assert main(["compare", str(a), str(b), "--json"]) == EXIT.OK
    got = json.loads(capsys.readouterr().out)
    assert got["noise"]["verdict"] == "faster"
    assert got["blocks"]["mlp"]["verdict"] == "faster"


def test_the_headline_is_inside_its_own_interval():
    """A few slow outlier steps pull the mean far from the median: the headline ratio was
    of means and its interval of medians ("0.72x [0.74, 22.20]"); now both are medians."""
    base = _with_samples(1000.0, [100.0] * 9 + [3000.0] * 3, op_us=500.0)
    opt = _with_samples(100.0, [100.0] * 12, op_us=50.0)
    base.step["time_us"]["mean"] = sum(base.step["time_us"]["samples"]) / 12
    c = compare_profiles(base, opt)
    r = c["noise"]["time_ratio"]
    assert 1 / r["high"] <= c["step_speedup"] <= 1 / r["low"]
    assert c["step_speedup_of"] == "median step times"


def test_the_same_weights_under_another_class_compare_with_allow_different(tmp_path, capsys):
    """The seed's own before/after: the same weights pinned to modeling with fused ops is
    another class with the same parameter count; refused unless --allow-different, which
    says so in the result. Another parameter count stays refused."""
    import pytest

    from pypto_tune import NotComparableError

    base = _with_samples(1000.0, _jitter(1000.0, 20.0), op_us=600.0)
    opt = _with_samples(700.0, _jitter(700.0, 20.0), op_us=300.0)
    base.meta["model"] = {"class": "LlamaForCausalLM", "parameters": 344704}
    opt.meta["model"] = {"class": "HotspotForCausalLM", "parameters": 344704}
    with pytest.raises(NotComparableError, match="pass --allow-different"):
        compare_profiles(base, opt)
    c = compare_profiles(base, opt, allow_different=True)
    assert c["models"]["allowed_different"] is True
    assert c["noise"]["verdict"] == "faster"
    paths = []
    for name, p in (("base", base), ("opt", opt)):
        paths.append(str(write_profile(p, tmp_path / name)))
    assert main(["compare", *paths]) == EXIT.NOT_COMPARABLE
    assert "--allow-different" in capsys.readouterr().err
    assert main(["compare", *paths, "--allow-different", "--json"]) == EXIT.OK
    assert json.loads(capsys.readouterr().out)["models"]["allowed_different"] is True
    opt.meta["model"] = {"class": "HotspotForCausalLM", "parameters": 999}
    with pytest.raises(NotComparableError, match="different models"):
        compare_profiles(base, opt, allow_different=True)
