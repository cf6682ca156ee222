"""The seed's timing protocol: short warmups, N synchronised timed runs, mean headline."""

import json
import statistics

from pypto_models_gutenocr import EXIT
from pypto_models_gutenocr.cli import build_parser, main
from pypto_models_gutenocr.runner import WARMUP_NEW_TOKENS
from pypto_testing.gutenocr import cli_argv


def test_defaults_are_the_seeds_and_documented_in_help():
    parser = build_parser()
    bench = parser.parse_args(["bench"])
    ask = parser.parse_args(["ask"])
    assert (bench.runs, bench.output_length, bench.warmup) == (5, 100, 5)
    assert (ask.runs, ask.output_length, ask.warmup) == (5, 50, 5)
    sub = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, length in (("bench", 100), ("ask", 50)):
        text = " ".join(sub[name].format_help().split())
        assert f"new tokens per timed run (min and max, greedy) (default: {length})" in text
        assert f"warmup generations of {WARMUP_NEW_TOKENS} new tokens each (default: 5)" in text
        assert "(default: 5)" in text.split("--runs", 2)[-1]


def test_ask_warms_up_short_then_reports_the_mean_of_five_runs(tiny_gutenocr, capsys):
    """Warmups are 10-token generations (not full length); five timed runs by default."""
    rc = main(cli_argv("ask", tiny_gutenocr, "--json", warmup=2, output_length=13))
    out, err = capsys.readouterr()
    assert rc == EXIT.OK, err
    report = json.loads(out)
    assert report["warmup_new_tokens"] == [WARMUP_NEW_TOKENS, WARMUP_NEW_TOKENS]
    samples = report["generate_s_all"]
    assert len(samples) == 5
    assert report["generate_s_estimator"] == "mean"
    assert report["generate_s"] == statistics.fmean(samples)
    st = report["generate_s_stats"]
    assert st["best"] == min(samples)
    assert st["median"] == statistics.median(samples)
    assert st["stdev"] == statistics.stdev(samples)
    assert report["tokens"] == 13
    assert report["tok_per_s"] == 13 / report["generate_s"]
    assert report["synchronized"] is True
    # Human line: mean with best / median / stdev beside it.
    assert "mean of 5 (best" in err
    assert "stdev" in err


def test_cpu_peak_memory_is_the_resident_peak_of_the_timed_runs(tiny_gutenocr, capsys):
    """Not an allocator 0, and not the load: VmHWM reset before the timed runs."""
    rc = main(cli_argv("ask", tiny_gutenocr, "--json", warmup=0, runs=1, output_length=2))
    assert rc == EXIT.OK
    peak = json.loads(capsys.readouterr().out)["peak_memory"]
    assert peak["kind"] == "process_peak_rss"
    assert peak["unavailable"] is None
    assert isinstance(peak["peak_allocated"], int)
    assert peak["peak_allocated"] > 2**20
    assert "clear_refs" in peak["method"]
    assert "VmHWM" in peak["method"]


def test_bench_summary_puts_best_median_stdev_beside_the_mean(
    tiny_gutenocr, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("PYPTO_GUTENOCR_CPU_SIM", "0")
    rc = main(
        cli_argv(
            "bench",
            tiny_gutenocr,
            "--output-dir",
            str(tmp_path),
            "--json",
            warmup=1,
            runs=3,
            output_length=2,
        )
    )
    assert rc == EXIT.OK
    summary = json.loads(capsys.readouterr().out)
    row = summary["metrics"]["generate_s"]
    base = json.loads((tmp_path / "baseline.json").read_text())
    assert row["estimator"] == "mean"
    assert row["baseline"] == statistics.fmean(base["generate_s_all"])
    assert row["baseline_stats"]["best"] == min(base["generate_s_all"])
    assert set(row["pypto_stats"]) == {"best", "median", "stdev"}
    assert summary["metrics"]["peak_memory_bytes"]["baseline"] > 0
