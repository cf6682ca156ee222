"""``pypto-tune tile-search``: real searches in PyPTO's SIM cost model on the CPU (reduced
shapes), and every bad input a one-line error with its exit code that writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pypto_tune import EXIT
from pypto_tune.cli import main
from pypto_tune.cli_tiles import parse_shape
from pypto_tune.errors import BadInputError, EnvironmentMissingError, SearchFailedError
from pypto_tune.tiles import NOTE, discover_tunables, tile_search

SMALL_MLP = "rows=16,hidden=256,inter=512"


def _needs_pypto() -> None:
    pytest.importorskip("pypto")
    reason = discover_tunables()["rms_norm"].availability()
    if reason:
        pytest.skip(reason)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    lines = [ln for ln in err if ln.startswith("pypto-tune: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def in_empty_dir(tmp_path: Path, monkeypatch) -> Path:
    """Run in an empty folder so a test can assert that nothing was written."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_tunable_kernels_are_found_through_the_kernel_plugins():
    found = discover_tunables()
    assert {"rms_norm", "swiglu_mlp"} <= set(found)
    assert found["swiglu_mlp"].shape_names == ("rows", "hidden", "inter")


# --------------------------------------------------------------------------- real searches


@pytest.mark.slow
def test_cli_search_json_is_one_document_on_stdout(capsys, in_empty_dir):
    _needs_pypto()
    rc = main(
        ["tile-search", "rms_norm", "--shape", "rows=16,hidden=512", "--budget", "6", "--json"]
    )
    out = capsys.readouterr()
    assert rc == EXIT.OK, out.err
    doc = json.loads(out.out)  # PyPTO's own prints must not reach stdout
    assert doc["schema"] == "pypto-tune.tile-search"
    assert doc["kernel"] == "rms_norm"
    assert doc["shape"] == {"rows": 16, "hidden": 512}
    assert doc["method"] == "coordinate-descent"
    assert 1 < doc["evaluated"] <= 6
    assert doc["default"]["is_default"]
    assert doc["default"]["tiles"] == {
        "rows": 8,
        "vec_rows": 8,
        "vec_cols": 2048,
        "cube_m": [64, 64],
        "cube_k": [256, 256],
        "cube_n": [256, 256],
    }
    assert doc["best_us"] <= doc["default_us"]
    assert doc["speedup"] == pytest.approx(doc["default_us"] / doc["best_us"])
    assert doc["note"] == NOTE
    assert "relative signal" in doc["note"]
    for c in doc["candidates"]:
        assert (c["sim_us"] is not None) == c["ok"]
        assert c["ok"] or c["error"]
    assert "[1/6]" in out.err  # progress for humans on stderr
    assert list(in_empty_dir.iterdir()) == []


@pytest.mark.slow
def test_exhaustive_when_the_space_fits_the_budget():
    _needs_pypto()
    seen: list[tuple[int, int]] = []
    res = tile_search(
        "rms_norm",
        {"rows": 1, "hidden": 64},
        budget=10,
        progress=lambda done, total, entry: seen.append((done, total)),
    )
    assert res.method == "exhaustive"
    assert res.space_size == 10
    assert len(res.candidates) == 10
    assert seen == [(i, 10) for i in range(1, 11)]
    assert res.best is not None
    assert res.best["sim_us"] == min(c["sim_us"] for c in res.candidates if c["ok"])
    json.dumps(res.to_dict())


@pytest.mark.slow
def test_descent_moves_off_the_default_on_several_axes(capsys):
    """The default's loop step (64) is wider than small row counts allow for the other
    candidates; it must still have neighbours on every axis (it once had only cube_k)."""
    _needs_pypto()
    res = tile_search("swiglu_mlp", parse_shape(SMALL_MLP), budget=14)
    assert res.method == "coordinate-descent"
    assert len(res.candidates) == 14
    default = res.candidates[0]["tiles"]
    changed = {k for c in res.candidates for k, v in c["tiles"].items() if v != default[k]}
    assert len(changed) >= 3, changed
    assert res.speedup is not None
    assert res.speedup >= 1.0


@pytest.mark.slow
def test_nothing_ran_is_search_failed(capsys, in_empty_dir):
    """Every candidate stopped by the timeout: SEARCH_FAILED, one line, nothing written."""
    _needs_pypto()
    with pytest.raises(SearchFailedError, match="no candidate tiling"):
        tile_search("rms_norm", {"rows": 16, "hidden": 512}, budget=2, timeout_s=0.01)
    rc = main(
        [
            "tile-search",
            "rms_norm",
            "--shape",
            "rows=16,hidden=512",
            "--budget",
            "1",
            "--timeout",
            "0.01",
        ]
    )
    assert rc == EXIT.SEARCH_FAILED
    assert "timed out" in _one_line_error(capsys)
    assert list(in_empty_dir.iterdir()) == []


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["flash_attn", "--shape", "rows=1"], EXIT.USAGE, "tunable kernels: rms_norm, swiglu_mlp"),
        (["rms_norm", "--shape", "rows=16"], EXIT.USAGE, "missing ['hidden']"),
        (["rms_norm", "--shape", "rows=16,hidden"], EXIT.USAGE, "each item must be NAME=N"),
        (["rms_norm", "--shape", "rows=16,hidden=2k"], EXIT.USAGE, "hidden=2k is not an integer"),
        (["rms_norm", "--shape", "rows=1,rows=2"], EXIT.USAGE, "rows given twice"),
        (
            ["rms_norm", "--shape", "rows=16,hidden=100"],
            EXIT.USAGE,
            "outside the kernel's envelope",
        ),
        (["swiglu_mlp", "--shape", "rows=16,hidden=256,inter=40000"], EXIT.USAGE, "outside"),
        (["rms_norm", "--shape", "rows=-4,hidden=512"], EXIT.USAGE, "positive integer"),
        (["rms_norm", "--shape", "rows=16,hidden=512", "--budget", "0"], EXIT.USAGE, "budget 0"),
        (["rms_norm", "--shape", "rows=16,hidden=512", "--timeout", "-1"], EXIT.USAGE, "timeout"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(argv, code, needle, capsys, in_empty_dir):
    assert main(["tile-search", *argv]) == code
    line = _one_line_error(capsys)
    assert needle in line, line
    assert list(in_empty_dir.iterdir()) == []


def test_bad_dtype_is_usage(capsys):
    assert main(["tile-search", "rms_norm", "--shape", "rows=1,hidden=64", "--dtype", "int8"]) == (
        EXIT.USAGE
    )
    assert "invalid choice" in capsys.readouterr().err


def test_library_errors_are_typed():
    with pytest.raises(BadInputError, match="unknown kernel 'nope'"):
        tile_search("nope", {"rows": 1})
    with pytest.raises(BadInputError, match="dtype 'int8'"):
        tile_search("rms_norm", {"rows": 1, "hidden": 64}, dtype="int8")
    with pytest.raises(EnvironmentMissingError, match=r"pip install 'pypto-tune\[kernels\]'"):
        tile_search("rms_norm", {"rows": 1, "hidden": 64}, tunables={})


def test_missing_pypto_names_the_install(monkeypatch, capsys, in_empty_dir):
    from pypto_kernels_gutenocr import sim_shim

    monkeypatch.setattr(sim_shim, "installed_version", lambda: None)
    assert main(["tile-search", "rms_norm", "--shape", "rows=1,hidden=64"]) == EXIT.ENVIRONMENT
    assert "pip install 'pypto-kernels-gutenocr[pypto]'" in _one_line_error(capsys)
    assert list(in_empty_dir.iterdir()) == []


def test_missing_compiler_is_environment(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a real PATH without g++
    assert main(["tile-search", "rms_norm", "--shape", "rows=1,hidden=64"]) == EXIT.ENVIRONMENT
    assert "g++" in _one_line_error(capsys)


def test_help_lists_the_flags(capsys):
    assert main(["tile-search", "--help"]) == EXIT.OK
    out = capsys.readouterr().out
    for flag in ("--shape", "--dtype", "--budget", "--timeout", "--json"):
        assert flag in out
