"""Holistic Trace Analysis reads the per-rank traces `pypto-tune profile --nproc 2` keeps
(issue #45), and agrees with our figures: the real tool, installed only by
`nox -s interop` (skipped elsewhere).

What HTA 0.5.0 computes on these CPU traces, and what it cannot (it needs GPU kernels),
is written in docs/tune.md; this test pins both, so a new HTA that changes either is seen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

hta_analysis = pytest.importorskip(
    "hta.trace_analysis", reason="Holistic Trace Analysis is installed by `nox -s interop` only"
)

TUNE = str(Path(sys.executable).parent / "pypto-tune")


def _profile(model: Path, out: Path, *extra: str) -> Path:
    """`pypto-tune profile` of a short CPU decode into ``out`` (``extra``: e.g. --nproc 2)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    got = subprocess.run(
        [TUNE, "profile", "--model-path", str(model), "--device", "cpu", *extra,
         "--regime", "decode", "--seq", "8", "--gen", "8", "--iters", "2", "--warmup", "1",
         "--out", str(out), "-q"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def rank_traces(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _profile(tiny_llama, tmp_path_factory.mktemp("hta") / "out", "--nproc", "2")


def test_hta_reads_every_rank_and_step_and_agrees_on_collective_time(
    rank_traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # HTA rounds timestamps to whole microseconds unless told not to: then its operator
    # durations are the trace's own.
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    ta = hta_analysis.TraceAnalysis(trace_dir=str(rank_traces / "ranks" / "eager"))
    assert sorted(ta.t.traces) == [0, 1]  # the ranks, from torch's distributedInfo
    assert [int(s) for s in ta.get_profiler_steps()] == [0]  # our ProfilerStep#0 mark
    ours = {r["rank"]: r for r in json.loads((rank_traces / "ranks.json").read_text())["ranks"]}
    report = json.loads((rank_traces / "report.json").read_text())
    by_rank = {r["rank"]: r["communication"] for r in report["distributed"]["ranks"]}
    symbols = ta.t.symbol_table.get_sym_table()
    for rank in (0, 1):
        df = ta.t.get_trace(rank)
        names = df["name"].map(lambda i: symbols[i])
        # Each collective op's total time, HTA's sum against ours (by_op_s, seconds).
        for op, seconds in by_rank[rank]["by_op_s"].items():
            hta_us = float(df.loc[names == op, "dur"].sum())
            assert hta_us == pytest.approx(seconds * 1e6, abs=0.01), (rank, op)
        assert ours[rank]["profile"] == f"ranks/eager/rank{rank}.trace.json"
    # What HTA computes on a CPU trace: the communication / computation overlap (no GPU
    # work: nothing overlaps) ...
    overlap = ta.get_comm_comp_overlap(visualize=False)
    assert sorted(int(r) for r in overlap["rank"]) == [0, 1]


def test_what_hta_cannot_compute_on_a_cpu_trace(rank_traces: Path) -> None:
    """... and what it cannot: its temporal and idle-time breakdowns and its straggler
    analysis read GPU kernels, which a CPU trace has none of (docs/tune.md says so)."""
    ta = hta_analysis.TraceAnalysis(trace_dir=str(rank_traces / "ranks" / "eager"))
    for analysis, kwargs in (
        (ta.get_temporal_breakdown, {"visualize": False}),
        (ta.get_idle_time_breakdown, {"visualize": False}),
        (ta.get_potential_stragglers, {}),
    ):
        with pytest.raises((IndexError, ValueError)):
            analysis(**kwargs)


@pytest.fixture(scope="module")
def one_process(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _profile(tiny_llama, tmp_path_factory.mktemp("hta1") / "out")


def test_hta_finds_every_step_of_a_one_process_profile(
    one_process: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.profiler's own trace of a one-process profile, kept in DIR/torch with a
    ``ProfilerStep#<n>`` per profiled step: HTA loads it as rank 0 and finds the steps
    profile.json counts, each as long as our step."""
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    folder = str(one_process / "torch")
    profile = json.loads((one_process / "profile.json").read_text())
    count = profile["step"]["count"]
    assert count > 1
    # By default HTA drops a trace's last profiler step (a scheduled profiler's last one is
    # often cut short): every step but the last, then every step when asked for it.
    plain = hta_analysis.TraceAnalysis(trace_dir=folder)
    assert [int(s) for s in plain.get_profiler_steps()] == list(range(count - 1))
    ta = hta_analysis.TraceAnalysis(trace_dir=folder, include_last_profiler_step=True)
    assert sorted(ta.t.traces) == [0]
    assert [int(s) for s in ta.get_profiler_steps()] == list(range(count))
    symbols = ta.t.symbol_table.get_sym_table()
    df = ta.t.get_trace(0)
    names = df["name"].map(lambda i: symbols[i])
    steps = df.loc[names.str.startswith("ProfilerStep#")]
    assert len(steps) == count
    # Each step's length is our step mark's: the samples profile.json keeps are taken from
    # one forward to the next, so the marks are never longer than them.
    samples = profile["step"]["time_us"]["samples"]
    assert float(steps["dur"].sum()) <= sum(samples) * 1.001
