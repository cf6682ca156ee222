"""CPU memory per arm: the process's resident-set peak, never an allocator 0 (issue #16)."""

from __future__ import annotations

import json
import re
import sys

import pytest

from pypto_bench.measure import RssPeak, read_rss
from pypto_bench.report import format_table, report_to_markdown, validate_report


def _rss_cells(table: str, n_arms: int) -> list[str]:
    """The "peak RSS MiB" cell of each arm row (columns are separated by 2+ spaces)."""
    head, _, *rows = table.splitlines()
    names = re.split(r"\s{2,}", head.strip())
    col = names.index("peak RSS MiB")
    return [re.split(r"\s{2,}", row.strip())[col] for row in rows[:n_arms]]


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")


@linux_only
def test_cpu_arms_record_a_plausible_rss_peak(decode_report):
    _report, path = decode_report
    data = json.loads(path.read_text())
    validate_report(data)
    param_bytes = data["model"]["parameters"] * 4  # fp32 tiny model, resident during the arm
    for arm in data["arms"]:
        mem = arm["memory"]
        # No allocator counters on CPU: null, not a 0 that reads as a measurement.
        assert mem["peak_allocated"] is None
        assert mem["peak_reserved"] is None
        assert mem["rss_unavailable"] is None
        assert "clear_refs" in mem["rss_method"]
        assert mem["rss_peak_bytes"] >= param_bytes
        assert mem["rss_peak_bytes"] >= mem["rss_bytes"] > 0
    load = data["model"]["load_memory"]
    assert load["peak_allocated"] is None
    assert load["rss_peak_bytes"] >= param_bytes  # the weights were resident after loading


@linux_only
def test_cpu_table_and_markdown_show_rss_never_allocator_zero(decode_report):
    report, _ = decode_report
    table = format_table(report)
    head = table.splitlines()[0]
    assert "peak RSS MiB" in head
    assert "RSS after MiB" in head
    assert "peak alloc MiB" not in head
    for cell in _rss_cells(table, len(report.arms)):
        assert cell not in ("0.0", "-")
        assert float(cell) > 0
    md = report_to_markdown(report)
    assert "peak RSS MiB" in md
    assert "peak alloc MiB" not in md
    for line in md.splitlines():
        if line.startswith(("| eager |", "| graph |")):
            assert "| 0.0 |" not in line


def test_rss_reset_refused_records_none_with_the_reason(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    out = RssPeak().result()
    assert out["rss_peak_bytes"] is None
    assert out["rss_bytes"] is None
    assert out["rss_method"] is None
    assert "not Linux (darwin)" in out["rss_unavailable"]


def test_unmeasured_rss_prints_dash_and_why(decode_report):
    report, _ = decode_report
    data = report.to_dict()
    for arm in data["arms"]:
        arm["memory"].update(
            rss_peak_bytes=None, rss_bytes=None, rss_method=None, rss_unavailable="no /proc here"
        )
    validate_report(data)
    table = format_table(data)
    assert _rss_cells(table, len(data["arms"])) == ["-"] * len(data["arms"])
    assert "resident-set peak not measured: no /proc here" in table
    assert "no /proc here" in report_to_markdown(data)


def test_older_cpu_report_without_rss_fields_still_renders(decode_report):
    """A 1.1 CPU report carries allocator zeros and no RSS: shown as "-", not 0.0."""
    report, _ = decode_report
    data = report.to_dict()
    for arm in data["arms"]:
        arm["memory"] = {
            "peak_allocated": 0,
            "peak_reserved": 0,
            "reserved_per_iter": [0, 0, 0],
            "reserved_growth": 0,
        }
    validate_report(data)
    assert _rss_cells(format_table(data), len(data["arms"])) == ["-"] * len(data["arms"])


@linux_only
def test_read_rss_is_the_kernels_figure():
    peak, now = read_rss()
    assert peak is not None
    assert now is not None
    assert peak >= now > 0


@linux_only
def test_each_phase_has_its_own_peak():
    """Peak memory per phase (issue #45): a 256 MiB buffer held only while capturing shows
    in the capture phase's peak and not in the timed phase's (the peak is reset between)."""
    import torch

    from pypto_bench.protocol.base import Memory

    mem = Memory(torch.device("cpu"))
    big = torch.ones(64 << 20, dtype=torch.float32)  # 256 MiB, touched
    del big
    mem.end_phase("capture")
    small = torch.ones(1 << 20)  # 4 MiB
    out = mem.result()
    del small
    capture, timed = out["phases"]["capture"], out["phases"]["timed"]
    assert capture["rss_peak_bytes"] - timed["rss_peak_bytes"] > 200 << 20, (capture, timed)
    assert timed["rss_peak_bytes"] == out["rss_peak_bytes"]  # the top level is the last phase


@linux_only
def test_the_report_shows_each_arm_s_peak_per_phase(decode_report):
    report, path = decode_report
    data = json.loads(path.read_text())
    for arm in data["arms"]:
        phases = arm["memory"]["phases"]
        assert set(phases) == {"capture", "timed"}
        assert phases["capture"]["rss_peak_bytes"] > 0
        assert phases["timed"]["rss_peak_bytes"] == arm["memory"]["rss_peak_bytes"]
    md = report_to_markdown(report)
    assert md.count("peak memory per phase: capture ") == len(data["arms"])
