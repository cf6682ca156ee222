"""The CLI: profile -> advise -> compare on a real tiny model folder, and every bad input
a one-line error with its exit code that writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pypto_tune import EXIT, write_profile
from pypto_tune.cli import main

FAST = ["--device", "cpu", "--regime", "decode", "--seq", "8", "--gen", "8", "--iters", "1"]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    lines = [ln for ln in err if ln.startswith("pypto-tune: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def profiled(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    out, outside = root / "prof", root / "outside"
    out.mkdir()
    outside.mkdir()
    for name in OUTPUTS:  # links planted at every output's name, to files outside --out
        (outside / name).write_text("keep me")
        (out / name).symlink_to(outside / name)
    (outside / "torch").mkdir()  # and at the torch trace's folder, to a folder outside
    (out / "torch").symlink_to(outside / "torch", target_is_directory=True)
    assert (
        main(["profile", "--model-path", str(tiny_llama), *FAST, "--out", str(out), "-q"])
        == EXIT.OK
    )
    return out


OUTPUTS = (
    "profile.json",
    "profile.md",
    "report.html",
    "trace.json",
    "breakdown.png",
)


def test_profile_writes_every_output(profiled: Path):
    names = {p.name for p in profiled.iterdir()}
    assert {*OUTPUTS, "torch"} == names
    assert [p.name for p in (profiled / "torch").iterdir()] == ["trace.json"]
    assert not (profiled / "torch").is_symlink()
    assert list((profiled.parent / "outside" / "torch").iterdir()) == []
    for name in OUTPUTS:  # the planted links were replaced, their targets untouched
        assert not (profiled / name).is_symlink()
        assert (profiled / name).is_file()
        assert (profiled.parent / "outside" / name).read_text() == "keep me"
    data = json.loads((profiled / "profile.json").read_text())
    assert data["meta"]["arm"] == "eager"
    assert data["recommendations"]
    assert data["meta"]["command_line"][:2] == ["pypto-tune", "profile"]
    json.loads((profiled / "trace.json").read_text())


def test_the_torch_trace_marks_every_profiled_step(profiled: Path):
    """torch.profiler's own trace beside ours (issue #45), each step a ``ProfilerStep#<n>``
    slice with the bounds of our step mark: what Holistic Trace Analysis's step-based
    analyses need (``nox -s interop`` runs HTA on it)."""
    events = json.loads((profiled / "torch" / "trace.json").read_text())["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert [e["name"] for e in steps] == [f"ProfilerStep#{i}" for i in range(len(steps))]
    marks = {
        (e["ts"], e["dur"], e["pid"], e["tid"])
        for e in events
        if e.get("name") in ("pypto_tune.step", "pypto_capture::step")
    }
    assert steps
    assert all(e["ph"] == "X" for e in steps)
    assert all((e["ts"], e["dur"], e["pid"], e["tid"]) in marks for e in steps)
    ends = [e["ts"] + e["dur"] for e in steps]
    assert all(b["ts"] >= a_end for a_end, b in zip(ends[:-1], steps[1:], strict=True))
    profile = json.loads((profiled / "profile.json").read_text())
    assert len(steps) == profile["step"]["count"], (len(steps), profile["step"]["count"])


def test_profile_json_on_stdout(tiny_llama: Path, capsys):
    code = main(["profile", "--model-path", str(tiny_llama), *FAST, "--json", "-q", "--no-peaks"])
    assert code == EXIT.OK
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "pypto-tune.profile"
    assert data["peaks"] == {}


def test_advise_with_a_changed_threshold(profiled: Path, capsys):
    path = str(profiled / "profile.json")
    assert main(["advise", path, "--json"]) == EXIT.OK
    before = json.loads(capsys.readouterr().out)
    # generate's stopping check reads a device value once per step: a count, not a time.
    assert "host_syncs" in {f["id"] for f in before["findings"]}
    assert main(["advise", path, "--json", "--threshold", "host_syncs_per_step=5"]) == EXIT.OK
    after = json.loads(capsys.readouterr().out)
    assert "host_syncs" not in {f["id"] for f in after["findings"]}


def test_compare_same_profile_is_1x(profiled: Path, capsys):
    path = str(profiled / "profile.json")
    assert main(["compare", path, path, "--json"]) == EXIT.OK
    assert json.loads(capsys.readouterr().out)["step_speedup"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["profile", "--model-path", "{missing}", *FAST], EXIT.USAGE, "does not exist"),
        (
            ["profile", "--model-path", "{model}", *FAST, "--arm", "fast"],
            EXIT.USAGE,
            "invalid choice",
        ),
        (
            ["profile", "--model-path", "{model}", *FAST, "--threshold", "bogus=1"],
            EXIT.USAGE,
            "unknown threshold",
        ),
        (
            ["profile", "--model-path", "{model}", *FAST, "--out", "{file}"],
            EXIT.USAGE,
            "not a folder",
        ),
        (
            ["profile", "--model-path", "{model}", "--device", "cuda:0", *FAST[2:]],
            EXIT.ENVIRONMENT,
            "cuda",
        ),
        (
            ["profile", "--model-path", "{model}", *FAST, "--arm", "pypto+graph"],
            EXIT.FAILED,
            "plug-in",
        ),
        (
            ["profile", "--model-path", "{model}", *FAST, "--batch", "1,2"],
            EXIT.USAGE,
            "a profile is of one batch size",
        ),
        (["advise", "{missing}"], EXIT.USAGE, "no such file"),
        (["advise", "{file}"], EXIT.BAD_PROFILE, "not readable JSON"),
        (["compare", "{file}", "{file}", "--tolerance", "0.5"], EXIT.USAGE, "tolerance"),
    ],
)
def test_bad_input_is_one_line(tmp_path, tiny_llama, capsys, argv, code, words):
    bad = tmp_path / "bad.txt"
    bad.write_text("not json")
    values = {"missing": str(tmp_path / "nope"), "model": str(tiny_llama), "file": str(bad)}
    args = [a.format(**values) for a in argv]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(args) == code
    if code != EXIT.USAGE or "invalid choice" not in words:
        assert words.lower() in _one_line_error(capsys).lower()
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_compare_refuses_profiles_of_different_shapes(profiled: Path, tmp_path, capsys):
    from pypto_tune import load_profile

    other = load_profile(profiled / "profile.json")
    other.meta["seq"] = 512
    write_profile(other, tmp_path / "other.json")
    code = main(["compare", str(profiled / "profile.json"), str(tmp_path / "other.json")])
    assert code == EXIT.NOT_COMPARABLE
    assert "seq" in _one_line_error(capsys)
