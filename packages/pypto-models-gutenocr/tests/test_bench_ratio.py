"""The GutenOCR bench's pypto/baseline ratio carries its interval (issue 31): the two
phases load separate models, so the interval is pypto-bench's unpaired bootstrap of the
ratio of medians, and the summary says why the runs are not interleaved."""

from __future__ import annotations

import json

from pypto_bench.intervals import UNPAIRED_METHOD
from pypto_models_gutenocr import EXIT
from pypto_models_gutenocr.cli import main
from pypto_models_gutenocr.runner import SEQUENTIAL_WHY, ratio_interval
from pypto_testing.gutenocr import cli_argv


def _phase(tokens: int, seconds: list[float]) -> dict:
    return {"tokens_all": [tokens] * len(seconds), "generate_s_all": seconds}


def test_ratio_interval_covers_a_known_ratio_and_is_unpaired():
    base = _phase(10, [1.0, 1.05, 0.95, 1.02, 0.98, 1.01])  # ~10 tok/s
    # ~20 tok/s, in the reverse order: pairing by index would widen nothing here, but
    # the method must say it is unpaired.
    pto = _phase(10, [0.49, 0.51, 0.5, 0.52, 0.48, 0.5])
    r = ratio_interval(base, pto)
    assert r is not None
    assert r["method"] == UNPAIRED_METHOD
    assert "unpaired" in r["method"]
    assert r["low"] <= 2.0 <= r["high"]
    assert r["low"] > 1.8
    assert r["high"] < 2.2
    assert r["rounds"] == 6


def test_ratio_interval_without_runs_is_none():
    assert ratio_interval(_phase(10, []), _phase(10, [1.0])) is None


def test_bench_summary_has_ratio_and_schedule(tiny_gutenocr, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYPTO_GUTENOCR_CPU_SIM", "0")
    argv = cli_argv(
        "bench",
        tiny_gutenocr,
        "--output-dir",
        str(tmp_path / "bench"),
        "--json",
        warmup=1,
        runs=3,
        output_length=2,
    )
    assert main(argv) == EXIT.OK
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    r = summary["ratio"]
    assert r["low"] <= r["median"] <= r["high"]
    assert r["rounds"] == 3
    assert "unpaired" in r["method"]
    assert summary["schedule"] == {"order": "sequential", "why": SEQUENTIAL_WHY}
    assert "pypto/baseline tok/s" in captured.err
    assert "unpaired" in captured.err
