"""The noise guard (issue #16): spread, roofline share > 100% and machine load."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pypto_bench import BenchConfig, compare, run_bench
from pypto_bench.cli import main
from pypto_bench.measure import summarize
from pypto_bench.noise import THRESHOLDS, LoadSampler, assess, noise_section
from pypto_bench.report import ArmResult, format_table, report_to_markdown

proc_stat = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc/stat")


def _arm(name: str, samples: list[float], share: float | None) -> ArmResult:
    arm = ArmResult(name=name, tokens_per_s=summarize(samples))
    if share is not None:
        arm.roofline = {"fraction_of_ceiling": share}
    return arm


def test_the_issue_figures_are_flagged_each_condition():
    """eager best 7.6 / median 1.2 and a 198% roofline share, as reported in issue #16."""
    eager = _arm("eager", [7.6, 1.2, 1.1], 1.98)
    graph = _arm("graph", [1.45, 1.44, 1.46], 0.4)
    checks = assess([eager, graph], {"other_share": 0.05, "cpu_count": 2})
    held = {(c["name"], c["where"], c["measure"]) for c in checks if c["holds"]}
    assert ("spread", "eager", "best / median tok/s") in held
    assert ("spread", "eager", "stdev / median tok/s") in held
    assert ("roofline", "eager", "measured tok/s / ceiling") in held
    assert not any(c["holds"] for c in checks if c["name"] == "load")
    assert not any(c["holds"] for c in checks if c["where"] == "graph")
    spread = next(c for c in checks if c["measure"] == "best / median tok/s" and c["holds"])
    assert spread["value"] == pytest.approx(7.6 / 1.2)
    assert spread["threshold"] == THRESHOLDS.best_over_median
    assert set(eager.unreliable["verdicts"]) == {"tok/s", "x eager", "roofline %"}
    # graph's own samples are steady, but its ratio is to a noisy eager and its roofline
    # share to a ceiling that eager beat.
    assert set(graph.unreliable["verdicts"]) == {"x eager", "roofline %"}
    assert "198%" in graph.unreliable["why"]


def test_machine_load_condition_marks_every_arm():
    arms = [_arm("eager", [10.0, 10.1], 0.5), _arm("graph", [20.0, 20.2], 0.9)]
    checks = assess(arms, {"other_share": 0.9, "cpu_count": 2})
    load = next(c for c in checks if c["name"] == "load")
    assert load["holds"]
    assert load["value"] == 0.9
    for arm in arms:
        assert "machine load" in arm.unreliable["why"]
    quiet = [_arm("eager", [10.0, 10.1], 0.5)]
    assert not any(c["holds"] for c in assess(quiet, {"other_share": 0.1}))
    assert quiet[0].unreliable is None
    # Without /proc/stat the 1-minute load average per core stands in.
    fallback = assess([_arm("eager", [10.0, 10.1], None)], {"loadavg_1m": 8.0, "cpu_count": 2})
    assert next(c for c in fallback if c["name"] == "load")["holds"]


def test_noisy_report_prints_unreliable_and_a_suggestion(decode_report):
    _, path = decode_report
    data = json.loads(path.read_text())
    eager = _arm("eager", [7.6, 1.2, 1.1], 1.98)
    checks = assess([eager], None)
    data["noise"] = noise_section(checks, None)
    data["arms"][0]["unreliable"] = eager.unreliable
    table = format_table(data)
    assert "UNRELIABLE" in table.splitlines()[2]  # the eager row's noise column
    assert "eager: UNRELIABLE tok/s, x eager, roofline %: eager tok/s spread" in table
    assert "NOISE: noisy run: spread at eager" in table
    assert "--iters" in table
    assert "OMP_NUM_THREADS" in table
    md = report_to_markdown(data)
    assert "| spread | eager | best / median tok/s | 6.33 | 1.5 | HOLDS |" in md
    assert "**eager**: UNRELIABLE" in md


def test_compare_warns_when_a_report_is_noisy(decode_report, tmp_path, capsys):
    _, path = decode_report
    data = json.loads(path.read_text())
    data["noise"] = noise_section([], None)  # clean, whatever the session's machine did
    for arm in data["arms"]:
        arm["unreliable"] = None
    noisy = json.loads(json.dumps(data))
    noisy["noise"] = noise_section(assess([_arm("eager", [7.6, 1.2, 1.1], 1.98)], None), None)
    noisy["arms"][0]["unreliable"] = {"verdicts": ["tok/s"], "why": "spread"}
    comp = compare([data, noisy])
    assert len(comp.warnings) == 1
    assert "#2" in comp.warnings[0]
    assert "noisy" in comp.warnings[0]
    assert "UNRELIABLE" in comp.to_text()
    (tmp_path / "a.json").write_text(json.dumps(data))
    (tmp_path / "b.json").write_text(json.dumps(noisy))
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    err = capsys.readouterr().err
    assert "pypto-bench: warning: report #2" in err
    # Two clean reports: no warning.
    assert compare([data, data]).warnings == []


def _background_share(seconds: float = 1.0) -> float | None:
    sampler = LoadSampler()
    time.sleep(seconds)
    return sampler.stop()["other_share"]


@proc_stat
def test_a_clean_tiny_run_has_no_unreliable_verdict(tiny_llama):
    before = _background_share()
    if before is not None and before > THRESHOLDS.other_load / 2:
        pytest.skip(f"other processes already use {before:.0%} of the cores: not a clean run")
    report = run_bench(
        BenchConfig(
            model_path=str(tiny_llama),
            device="cpu",
            seq=8,
            gen=8,
            batch=1,
            warmup=1,
            iters=2,
            arms=("eager", "graph"),
            graph_backend="eager",
        )
    )
    assert report.ok
    noise = report.noise
    assert noise is not None
    assert noise["noisy"] is False, noise["held"]
    assert {c["name"] for c in noise["checks"]} == {"spread", "roofline", "load"}
    assert noise["load"]["other_share"] is not None
    assert all(a.unreliable is None for a in report.arms)
    assert "UNRELIABLE" not in format_table(report)


def _start_detached_spinners(n: int) -> list[int]:
    """n processes spinning a core each, NOT descendants of this one (the launcher exits,
    so they are re-parented): to the load check they are other people's jobs."""
    launcher = (
        "import subprocess, sys\n"
        f"for _ in range({n}):\n"
        "    p = subprocess.Popen([sys.executable, '-c', 'while True: pass'],"
        " start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,"
        " stderr=subprocess.DEVNULL)\n"
        "    print(p.pid, flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", launcher], capture_output=True, text=True, check=True, timeout=60
    )
    return [int(pid) for pid in out.stdout.split()]


@proc_stat
def test_a_run_beside_busy_processes_is_flagged_by_the_load_condition(tiny_llama, tmp_path, capsys):
    pids: list[int] = []
    try:
        pids = _start_detached_spinners(2 * (os.cpu_count() or 1))
        time.sleep(0.5)  # let every spinner reach its loop
        out = tmp_path / "busy.json"
        code = main(
            [
                "run",
                "--model-path",
                str(tiny_llama),
                "--device",
                "cpu",
                "--seq",
                "8",
                "--gen",
                "8",
                "--warmup",
                "0",
                "--iters",
                "2",
                "--arms",
                "eager",
                "--no-bandwidth",
                "--no-progress",
                "--report-file",
                str(out),
            ]
        )
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert code == 0
    data = json.loads(out.read_text())
    load = next(c for c in data["noise"]["checks"] if c["name"] == "load")
    assert load["holds"], load
    assert load["value"] > THRESHOLDS.other_load
    assert data["noise"]["noisy"] is True
    assert "taskset" in data["noise"]["suggestion"]
    eager = data["arms"][0]
    assert "machine load" in eager["unreliable"]["why"]
    err = capsys.readouterr().err
    assert "eager: UNRELIABLE tok/s" in err
    # spread may hold too on a machine this busy; the load verdict must be there
    assert "noisy run: " in err
    assert "load at run" in err
