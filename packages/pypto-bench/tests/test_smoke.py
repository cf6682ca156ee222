"""The smoke gate on real tiny models: pass, each failure kind, and its exit codes."""

from __future__ import annotations

import json

import pytest

from pypto_bench import EXIT, coherence_score, degenerate_reason, smoke
from pypto_bench.cli import main
from pypto_bench.errors import ModelNotFoundError


def test_smoke_passes_on_printable_varied_output(letters_model):
    res = smoke(letters_model, device="cpu", max_new_tokens=24)
    assert res.passed, res.reason
    assert res.exit_code == EXIT.OK
    assert res.logits_finite is True
    assert res.text.strip()
    assert len(res.token_ids) == 24
    assert 0.0 <= res.coherence <= 1.0


def test_strict_fails_low_coherence_of_random_letters(letters_model):
    res = smoke(letters_model, device="cpu", max_new_tokens=24, strict=True, min_coherence=0.9)
    assert not res.passed
    assert res.exit_code == EXIT.LOW_COHERENCE
    assert "coherence" in res.reason


ROUTE = (
    "for a throughput-only run of random weights, pass --skip smoke (pypto-e2e) or run "
    "`pypto-bench run` directly"
)


def test_repeated_token_is_degenerate(zero_norm_model, capsys):
    res = smoke(zero_norm_model, device="cpu", max_new_tokens=8)
    assert not res.passed
    assert res.exit_code == EXIT.DEGENERATE
    assert "repeated 8 times" in res.reason
    # Random-weight models fail here by design: the message names the way on.
    assert ROUTE in res.reason
    code = main(["smoke", "--model-path", str(zero_norm_model), "--device", "cpu"])
    errors = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert code == EXIT.DEGENERATE
    assert len(errors) == 1
    assert ROUTE in errors[0]


def test_undecodable_bytes_are_degenerate(bytes_model):
    res = smoke(bytes_model, device="cpu", max_new_tokens=12)
    assert not res.passed
    assert res.exit_code == EXIT.DEGENERATE
    assert "undecodable" in res.reason
    assert ROUTE in res.reason


def test_remote_code_model_without_flag_names_the_flag(diffusion_model, capsys):
    res = smoke(diffusion_model, device="cpu", max_new_tokens=4)
    assert res.exit_code == EXIT.LOAD_FAILED
    assert res.stage == "load"
    assert "--trust-remote-code" in res.reason
    code = main(["smoke", "--model-path", str(diffusion_model), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == EXIT.LOAD_FAILED
    assert "--trust-remote-code" in err


def test_missing_and_non_model_folders_are_bad_input(tmp_path, capsys):
    with pytest.raises(ModelNotFoundError):
        smoke(tmp_path / "nope", device="cpu")
    (tmp_path / "empty").mkdir()
    code = main(["smoke", "--model-path", str(tmp_path / "empty"), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT.USAGE
    assert len(err) == 1
    assert "no config.json" in err[0]


def test_cli_json_and_text(letters_model, capsys):
    code = main(
        [
            "smoke",
            "--model-path",
            str(letters_model),
            "--device",
            "cpu",
            "--json",
            "--max-new-tokens",
            "10",
        ]
    )
    out = capsys.readouterr().out
    data = json.loads(out)
    assert code == EXIT.OK
    assert data["passed"]
    assert data["text"]


def test_coherence_heuristic_orders_text_sensibly():
    good = "The quick brown fox jumps over the lazy dog near the river bank today."
    loop = "the the the the the the the the the the the the"
    soup = "\ufffd\x05x\ufffd\x7f%$#\ufffd 9z\x01"
    assert coherence_score(good) > 0.8
    assert coherence_score(loop) < coherence_score(good)
    assert coherence_score(soup) < 0.3
    assert coherence_score("   ") == 0.0


def test_degenerate_reason_rules():
    assert degenerate_reason([], "") is not None
    assert "repeated" in degenerate_reason([5, 5, 5], "aaa")
    assert "undecodable" in degenerate_reason([1, 2, 3], "\ufffd\ufffd\ufffdab")
    assert degenerate_reason([1, 2, 3], "abc") is None
