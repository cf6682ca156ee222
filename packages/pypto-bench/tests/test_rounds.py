"""Interleaved rounds, intervals over rounds and --target-ci (issue 31).

Real runs on the tiny llama (the decode one is conftest's shared ``decode_report``, which
runs the default schedule); the estimator and the target loop also run on seeded
pure-Python simulations, deterministic.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import replace

import jsonschema
import pytest

from pypto_bench import BenchConfig, run_bench, schema
from pypto_bench.cli import main
from pypto_bench.errors import EXIT, BadInputError
from pypto_bench.intervals import interval, relative_half_width
from pypto_bench.measure import summarize
from pypto_bench.noise import assess
from pypto_bench.report import ArmResult, Report, format_table, report_to_markdown
from pypto_bench.rounds import (
    MIN_TARGET_ROUNDS,
    balanced_order,
    extend_to_target,
    ratio_widths,
)


def _abba(order: list[list], arms: list[str], rounds: int) -> None:
    expected = []
    for r in range(rounds):
        names = arms if r % 2 == 0 else arms[::-1]
        expected += [[n, r] for n in names]
    assert order == expected


def test_default_schedule_interleaves_abba_and_every_sample_counts(decode_report):
    report, path = decode_report
    data = json.loads(path.read_text())
    sched = data["schedule"]
    assert sched["kind"] == sched["requested"] == "interleaved"
    assert sched["rounds"] == 3
    _abba(sched["order"], ["eager", "graph"], 3)
    for arm in data["arms"]:
        # One sample per round, each from the round the order names.
        assert len(arm["tokens_per_s"]["samples"]) == 3
        assert sum(1 for name, _ in sched["order"] if name == arm["name"]) == 3
        tps = arm["tokens_per_s"]["interval"]
        assert tps["low"] <= tps["median"] <= tps["high"]
        assert tps["rounds"] == 3
        assert "bootstrap" in tps["method"]
    graph = data["arms"][1]
    ratio = graph["ratio_vs_eager"]
    eager = data["arms"][0]["tokens_per_s"]["samples"]
    paired = [g / e for g, e in zip(graph["tokens_per_s"]["samples"], eager, strict=True)]
    assert ratio["median"] == pytest.approx(sorted(paired)[1])
    assert ratio["low"] <= ratio["median"] <= ratio["high"]
    assert data["arms"][0]["ratio_vs_eager"] is None
    text = format_table(report)
    cell = f"{ratio['median']:.2f} [{ratio['low']:.2f}, {ratio['high']:.2f}]"
    assert f"x eager {cell}" in text
    assert "schedule: interleaved, 3 round(s)" in text
    assert f"x eager {cell}" in report_to_markdown(report)


@pytest.fixture(scope="module")
def prefill_runs(tiny_llama):
    """Prefill eager+graph twice: sequential, and interleaved with an unreachable target."""
    base = dict(
        model_path=str(tiny_llama),
        device="cpu",
        regime="prefill",
        seq=8,
        batch=1,
        arms=("eager", "graph"),
        warmup=1,
        iters=3,
        measure_bandwidth=False,
    )
    seq = run_bench(BenchConfig(**base, schedule="sequential"))
    bounded = run_bench(BenchConfig(**base, target_ci=1e-9, max_iters=6))
    return seq, bounded


def test_sequential_schedule_keeps_the_old_order(prefill_runs):
    seq, _ = prefill_runs
    data = seq.to_dict()
    jsonschema.validate(data, schema())
    assert data["schedule"]["kind"] == "sequential"
    assert data["schedule"]["order"] == [
        ["eager", 0],
        ["eager", 1],
        ["eager", 2],
        ["graph", 0],
        ["graph", 1],
        ["graph", 2],
    ]
    assert "memory" not in data["schedule"]
    # Intervals are stated for a sequential run too (paired by iteration index).
    assert data["arms"][1]["ratio_vs_eager"]["rounds"] == 3


def test_target_ci_stops_at_max_iters_when_unreachable(prefill_runs):
    _, bounded = prefill_runs
    data = bounded.to_dict()
    jsonschema.validate(data, schema())
    sched = data["schedule"]
    target = sched["target_ci"]
    assert target["met"] is False
    assert target["stopped"] == "max_iters (6 rounds)"
    # 3 rounds, then two at a time while <= 6: 5 (7 would pass the bound).
    assert sched["rounds"] == target["rounds"] == 5
    _abba(sched["order"], ["eager", "graph"], 5)
    for arm in data["arms"]:
        assert len(arm["tokens_per_s"]["samples"]) == 5
    assert "NOT met after 5 round(s), stopped: max_iters" in format_table(bounded)


# --- the estimator on simulations ------------------------------------------------------


def _simulate(schedule: str, rounds: int, seed: int) -> dict[str, list[float]]:
    """Eager 100 tok/s, graph 200 (true ratio 2.0); the machine slows linearly over time
    (speed / (1 + 0.05 t) in slot t) with 1% seeded noise."""
    rng = random.Random(seed)
    speed = {"eager": 100.0, "graph": 200.0}
    if schedule == "interleaved":
        slots = balanced_order(["eager", "graph"], rounds)
    else:
        slots = [(a, r) for a in ("eager", "graph") for r in range(rounds)]
    out: dict[str, list[float]] = {"eager": [0.0] * rounds, "graph": [0.0] * rounds}
    for t, (arm, r) in enumerate(slots):
        out[arm][r] = speed[arm] / (1 + 0.05 * t) * (1 + rng.gauss(0, 0.01))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_interval_covers_the_true_ratio_under_drift_where_sequential_does_not(seed):
    inter = _simulate("interleaved", 10, seed)
    seq = _simulate("sequential", 10, seed)
    got = interval(inter["graph"], inter["eager"], seed=seed)
    assert got is not None
    assert got.low <= 2.0 <= got.high
    assert relative_half_width(got.to_dict()) < 0.1
    bad = interval(seq["graph"], seq["eager"], seed=seed)
    assert bad is not None
    assert not bad.low <= 2.0 <= bad.high
    assert bad.high < 1.5  # drift went straight into the ratio
    # Deterministic: the same samples and seed give the same interval.
    assert interval(inter["graph"], inter["eager"], seed=seed) == got


def test_balanced_order_reverses_every_other_round():
    assert balanced_order(["a", "b", "c"], 2) == [
        ("a", 0),
        ("b", 0),
        ("c", 0),
        ("c", 1),
        ("b", 1),
        ("a", 1),
    ]
    assert balanced_order(["a", "b"], 2, start=3) == [("b", 3), ("a", 3), ("a", 4), ("b", 4)]


def _target_run(percent, *, noise, max_iters=200, max_seconds=1e9, clock=None):
    rng = random.Random(7)
    samples: dict[str, list[float]] = {"eager": [], "graph": []}
    played = []

    def play(first: int, count: int) -> None:
        for arm, r in balanced_order(["eager", "graph"], count, start=first):
            played.append((arm, r))
            base = 100.0 if arm == "eager" else 250.0
            samples[arm].append(base * (1 + rng.gauss(0, noise)))

    play(0, 3)
    kw = {"clock": clock} if clock else {}
    return (
        *extend_to_target(
            percent,
            max_iters=max_iters,
            max_seconds=max_seconds,
            rounds=3,
            widths=lambda: ratio_widths(samples),
            play=play,
            **kw,
        ),
        samples,
        played,
    )


def test_target_ci_adds_rounds_until_met():
    rounds, target, samples, played = _target_run(5.0, noise=0.2)
    assert target["met"] is True
    assert target["stopped"] == "met"
    assert rounds > 3
    assert (rounds - 3) % 2 == 0
    assert len(samples["graph"]) == rounds
    assert target["widest"]["relative_half_width"] <= 0.05
    # One round fewer was not enough: the loop stopped at the first rounds that met it.
    short = ratio_widths({k: v[: rounds - 2] for k, v in samples.items()})
    assert short[0]["relative_half_width"] > 0.05
    assert [r for _, r in played] == sorted(r for _, r in played)


def test_target_ci_is_not_met_before_min_rounds():
    # Three close rounds would meet a loose target at once: a 3-round bootstrap interval
    # can be narrow by chance, so rounds go on to MIN_TARGET_ROUNDS first.
    rounds, target, _, _ = _target_run(50.0, noise=0.01)
    assert target["met"] is True
    assert rounds == 7  # 3, 5, 7: the first count >= MIN_TARGET_ROUNDS (6)
    assert MIN_TARGET_ROUNDS == 6


def test_target_ci_stops_at_max_seconds_and_without_target():
    ticks = iter(range(1000))
    rounds, target, _, _ = _target_run(
        0.001, noise=0.2, max_seconds=4, clock=lambda: float(next(ticks))
    )
    assert target["met"] is False
    assert target["stopped"] == "max_seconds (4 s)"
    assert rounds < 200
    rounds, target, _, _ = _target_run(None, noise=0.2)
    assert (rounds, target) == (3, None)


# --- the noise guard reads the interval's width ---------------------------------------


def test_noise_guard_flags_a_wide_ratio_interval():
    def arm(name, samples):
        return ArmResult(name=name, tokens_per_s=summarize(samples))

    # Steady tok/s per arm (spread checks hold still) but paired ratios all over.
    report = Report(
        schema_version="1.4",
        tool={},
        created_at="",
        command_line=[],
        environment={},
        config={},
        regime="decode",
        arms=[
            arm("eager", [100, 100, 100, 150, 150, 150]),
            arm("graph", [300, 200, 300, 200, 300, 200]),
        ],
    )
    report.finish()
    checks = assess(report.arms, None)
    held = [c for c in checks if c["name"] == "interval" and c["holds"]]
    assert [c["where"] for c in held] == ["graph"]
    assert report.arm("graph").unreliable["verdicts"] == ["x eager"]
    assert "interval [" in report.arm("graph").unreliable["why"]
    steady = replace(report, arms=[arm("eager", [100] * 4), arm("graph", [200] * 4)])
    steady.finish()
    assert not [c for c in assess(steady.arms, None) if c["holds"]]


# --- flags ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"target_ci": math.nan}, "--target-ci must be a finite percentage"),
        ({"target_ci": -5.0}, "--target-ci must be a finite percentage"),
        ({"target_ci": 100.0}, "--target-ci must be a finite percentage"),
        ({"max_seconds": math.inf}, "--max-seconds must be finite and > 0"),
        ({"max_seconds": -1.0}, "--max-seconds must be finite and > 0"),
        ({"max_iters": 2, "target_ci": 5.0}, "--max-iters must be >= --iters (3)"),
        ({"max_iters": 2.5}, "--max-iters must be a whole number"),
        ({"schedule": "random"}, "unknown schedule 'random'"),
    ],
)
def test_bad_schedule_settings_are_refused(kw, needle):
    with pytest.raises(BadInputError, match=re.escape(needle)):
        BenchConfig(model_path="/x", **kw).validate()


def test_max_iters_bounds_only_target_ci_rounds():
    # A long fixed run (--iters above --max-iters' default) is not refused without
    # --target-ci: only the rounds --target-ci adds are bounded by it.
    BenchConfig(model_path="/x", iters=3000).validate()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--target-ci", "nan"], "--target-ci must be a finite percentage"),
        (["--target-ci=-3%"], "--target-ci must be a finite percentage"),
        (["--max-seconds", "nan"], "--max-seconds must be finite"),
        (["--max-iters", "1", "--target-ci", "5"], "--max-iters must be >= --iters"),
    ],
)
def test_bad_flags_exit_2_with_one_line(tiny_llama, tmp_path, capsys, argv, needle):
    report = tmp_path / "r.json"
    code = main(
        [
            "run",
            "--model-path",
            str(tiny_llama),
            "--device",
            "cpu",
            "--report-file",
            str(report),
            *argv,
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT.USAGE == 2
    assert len(err) == 1, err
    assert needle in err[0]
    assert not report.exists()


def test_diffusion_arms_interleave_and_keep_their_figures(diffusion_model, tmp_path):
    """The diffusion regime in rounds: one whole generation per arm per round, the graph
    arm's capture outside them, its tokens compared with eager's, its diffusion figures
    (path, forwards per iteration) as the sequential protocol writes them."""
    out = tmp_path / "diff.json"
    base = BenchConfig(
        model_path=str(diffusion_model),
        device="cpu",
        regime="diffusion-generate",
        seq=4,
        gen=8,
        diffusion_steps=4,
        warmup=1,
        iters=3,
        arms=("eager", "graph"),
        graph_backend="eager",
        measure_bandwidth=False,
        trust_remote_code=True,  # the tiny protocol model is a folder of our own code
    )
    report = run_bench(replace(base, report_file=str(out)))
    data = json.loads(out.read_text())
    jsonschema.validate(data, schema())
    assert report.ok, [a.error for a in report.arms]
    sched = data["schedule"]
    assert sched["kind"] == "interleaved"
    assert "why" not in sched
    _abba(sched["order"], ["eager", "graph"], 3)
    eager, graph = report.arm("eager"), report.arm("graph")
    assert graph.token_match["rate"] == 1.0
    assert graph.details["capture_s"] > 0
    assert graph.ratio_vs_eager["rounds"] == 3
    sequential = run_bench(replace(base, schedule="sequential"))
    assert sequential.schedule["kind"] == "sequential"
    for a, b in ((eager, sequential.arm("eager")), (graph, sequential.arm("graph"))):
        assert len(a.tokens_per_s["samples"]) == 3
        assert a.tokens_per_iter == b.tokens_per_iter
        da, db = a.details["diffusion"], b.details["diffusion"]
        assert da["path"] == db["path"]
        assert da["denoising_steps_per_iter"] == db["denoising_steps_per_iter"]
        assert da["forward_passes_per_iter"] == db["forward_passes_per_iter"]
