from __future__ import annotations

import logging

import pytest

from pypto_kernels_common import StatsRegistry, SwitchError, SwitchRegistry

OPS = ("gemm", "softmax")


def test_environment_sets_switches_at_registration(monkeypatch):
    monkeypatch.setenv("T_SWITCHES", "softmax")
    reg = SwitchRegistry(OPS, "T_SWITCHES")
    assert reg.snapshot() == {"USE_PTO_GEMM": False, "USE_PTO_SOFTMAX": True}
    monkeypatch.setenv("T_SWITCHES", "all")
    assert reg.load_from_env() == {"gemm": True, "softmax": True}


def test_a_bad_environment_value_names_the_op_and_the_choices(monkeypatch):
    monkeypatch.setenv("T_SWITCHES", "gemm,flash")
    with pytest.raises(SwitchError, match=r"^unknown op 'flash'; choose from gemm, softmax$"):
        SwitchRegistry(OPS, "T_SWITCHES")


def test_context_accepts_flag_names_restores_and_a_typo_changes_nothing():
    reg = SwitchRegistry(OPS, "T_UNSET", {"gemm": "USE_G", "softmax": "USE_S"})
    with reg.pto_switches({"USE_G": True}, softmax=None):
        assert reg.is_on("gemm")
        assert not reg.is_on("USE_S")
    assert not reg.is_on("gemm")
    with pytest.raises(SwitchError), reg.pto_switches(softmax=True, flash=True):
        pass
    assert not reg.is_on("softmax")


def test_stats_count_every_call_and_log_each_reason_once(caplog):
    caplog.set_level(logging.WARNING, logger="t.stats")
    stats = StatsRegistry(OPS, "t.stats")
    for reason in ("a", "a", "b"):
        stats.record_fallback("gemm", reason)
    stats.record_pypto("softmax")
    assert stats.calls() == {
        "gemm": {"pypto": 0, "reference": 3},
        "softmax": {"pypto": 1, "reference": 0},
    }
    assert stats.fallback_reasons() == {"gemm": "b"}
    assert len(caplog.records) == 2
    stats.reset()
    assert stats.report() == {
        "calls": {"gemm": {"pypto": 0, "reference": 0}, "softmax": {"pypto": 0, "reference": 0}},
        "fallback_reasons": {},
    }
