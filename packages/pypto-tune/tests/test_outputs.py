"""Outputs: the versioned JSON round trip, hostile profile files, Markdown, the plot and
the Chrome trace (module hierarchy as nested slices)."""

from __future__ import annotations

import itertools
import json

import pytest

from pypto_tune import (
    BadInputError,
    ProfileFormatError,
    chrome_trace,
    load_profile,
    plot_blocks,
    to_markdown,
    write_outputs,
    write_profile,
)
from pypto_tune.records import SCHEMA_VERSION


def test_profile_json_round_trip(tmp_path, eager_profile):
    path = write_profile(eager_profile, tmp_path / "p.json")
    data = json.loads(path.read_text())
    assert data["schema"] == "pypto-tune.profile"
    assert data["schema_version"] == SCHEMA_VERSION
    back = load_profile(path)
    assert back.step_us == pytest.approx(eager_profile.step_us)
    assert [o.name for o in back.ops] == [o.name for o in eager_profile.ops]
    assert back.recommendations == json.loads(json.dumps(eager_profile.recommendations))


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "not readable JSON"),
        ('{"schema": "something-else"}', "not a pypto-tune profile"),
        ('{"schema": "pypto-tune.profile", "schema_version": "9.0"}', "schema '9.0'"),
        (
            '{"schema": "pypto-tune.profile", "schema_version": "1.0", "ops": [{"x": 1}]}',
            "malformed",
        ),
        ("[" * 100000 + "]" * 100000, "not readable JSON"),
        ("[1, 2]", "not a pypto-tune profile"),
        (
            '{"schema": "pypto-tune.profile", "schema_version": "1.0", "step": {"time_us": 5}}',
            "step.time_us",
        ),
        (
            '{"schema": "pypto-tune.profile", "schema_version": "1.0", "ops": {}}',
            "wrong type for ops",
        ),
    ],
)
def test_hostile_profile_files_are_one_line_errors(tmp_path, content, match):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ProfileFormatError, match=match) as err:
        load_profile(path)
    assert "\n" not in str(err.value)


def test_missing_profile_file(tmp_path):
    with pytest.raises(BadInputError, match="no such file"):
        load_profile(tmp_path / "absent.json")


def test_oversize_profile_is_refused_by_the_bytes_read(tmp_path, monkeypatch):
    import pypto_tune.outputs as outputs

    path = tmp_path / "p.json"
    path.write_text(" " * 2000)
    monkeypatch.setattr(outputs, "MAX_PROFILE_BYTES", 1000)
    with pytest.raises(ProfileFormatError, match="larger than any"):
        load_profile(path)


def test_markdown_names_steps_blocks_findings_and_commands(eager_profile):
    md = to_markdown(eager_profile)
    assert "## Time by block" in md
    assert "host gaps" in md
    assert eager_profile.findings  # generate's per-step stopping check at least
    assert all(f"**{f['id']}**" in md for f in eager_profile.findings)
    assert all(r["command"] in md for r in eager_profile.recommendations if r.get("command"))


def test_chrome_trace_nests_modules_inside_steps(eager_profile, tmp_path):
    trace = chrome_trace(eager_profile)
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    steps = [e for e in events if e["cat"] == "step" and e["name"] == "pypto_tune.step"]
    modules = [e for e in events if e["cat"] == "module"]
    ops = [e for e in events if e["cat"] == "op"]
    assert steps
    assert modules
    assert ops
    layer = next(m for m in modules if m["name"] == "model.layers.0.self_attn")
    outer = next(m for m in modules if m["name"] == "model.layers.0")
    assert outer["ts"] <= layer["ts"]
    assert layer["ts"] + layer["dur"] <= outer["ts"] + outer["dur"]
    inside = [o for o in ops if o["args"]["module"] == "model.layers.0.self_attn"]
    assert inside
    assert all(layer["ts"] - 1 <= o["ts"] <= layer["ts"] + layer["dur"] for o in inside[:1])
    json.dumps(trace)  # serialisable as is


def test_chrome_trace_needs_the_raw_trace(tmp_path, eager_profile):
    back = load_profile(write_profile(eager_profile, tmp_path / "p.json"))
    with pytest.raises(BadInputError, match="re-profile"):
        chrome_trace(back)


def test_plot_writes_a_png(tmp_path, eager_profile):
    path = plot_blocks(eager_profile, tmp_path / "b.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


OUTPUTS = ("profile.json", "profile.md", "report.html", "trace.json", "breakdown.png")


def test_outputs_replace_planted_symlinks_and_leave_their_targets(tmp_path, eager_profile):
    """A link planted at each output's name (to a file outside --out) is replaced by the
    output; the file it pointed to is untouched (every output: temp file + rename)."""
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in OUTPUTS:
        (outside / name).write_bytes(b"keep me")
        (out / name).symlink_to(outside / name)
    written = write_outputs(eager_profile, out)
    assert set(written) == {"profile", "markdown", "html", "trace", "torch_trace", "plot"}
    for name in OUTPUTS:
        assert (outside / name).read_bytes() == b"keep me", name
        assert not (out / name).is_symlink(), name
        assert (out / name).is_file(), name
    assert (out / "breakdown.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert load_profile(out / "profile.json").step_us == pytest.approx(eager_profile.step_us)
    # no temp files left; torch.profiler's own trace in its folder
    assert sorted(p.name for p in out.iterdir()) == sorted([*OUTPUTS, "torch"])
    assert [p.name for p in (out / "torch").iterdir()] == ["trace.json"]
    mode = (out / "profile.json").stat().st_mode & 0o777
    assert mode == 0o666 & ~_umask()  # what a plain open() would have given


def _umask() -> int:
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_write_profile_replaces_a_planted_symlink(tmp_path, eager_profile):
    target = tmp_path / "victim.txt"
    target.write_text("keep me")
    link = tmp_path / "p.json"
    link.symlink_to(target)
    write_profile(eager_profile, link)
    assert target.read_text() == "keep me"
    assert not link.is_symlink()
    assert load_profile(link).meta["arm"] == "eager"


def test_non_finite_numbers_are_written_as_null_and_read_back(tmp_path, eager_profile):
    import copy

    prof = copy.copy(eager_profile)
    prof.peaks = {**eager_profile.peaks, "bandwidth_bytes_per_s": float("nan")}
    prof.findings = [{**f, "evidence": {"x": float("inf")}} for f in eager_profile.findings]
    path = write_profile(prof, tmp_path / "p.json")
    assert "NaN" not in path.read_text()
    assert "Infinity" not in path.read_text()
    back = load_profile(path)
    assert back.peaks["bandwidth_bytes_per_s"] is None
    to_markdown(back)  # a null peak prints, it does not raise


def test_the_trace_steps_are_the_steps_profile_json_averages(eager_profile):
    """Issue #45, item 2: trace.json's steps were the raw forward marks (18.3 ms mean)
    while profile.json's step runs from one forward to the next (19.1 ms). The trace's
    step slices now are those periods, each forward mark inside its step."""
    assert eager_profile.meta["regime"] == "decode"
    events = [e for e in chrome_trace(eager_profile)["traceEvents"] if e["ph"] == "X"]
    steps = [e for e in events if e["cat"] == "step" and e["name"] == "pypto_tune.step"]
    forwards = [e for e in events if e["cat"] == "forward"]
    assert len(steps) >= 2
    mean = sum(e["dur"] for e in steps) / len(steps)
    assert abs(mean - eager_profile.step_us) <= 1e-6 * max(eager_profile.step_us, 1.0)
    assert forwards, "the forward marks are kept inside their steps"
    for f in forwards:
        assert f["name"] == "pypto_tune.step (forward)"
        host = next(s for s in steps if s["ts"] == f["ts"])
        assert f["dur"] <= host["dur"] + 1e-6
    # consecutive decode steps tile the time between them: no gap a viewer would miss
    ordered = sorted(steps, key=lambda e: e["ts"])
    tiled = sum(
        1 for a, b in itertools.pairwise(ordered) if abs(a["ts"] + a["dur"] - b["ts"]) < 1e-6
    )
    assert tiled >= 1


def _overlaps_without_nesting(slices: list[dict]) -> list[tuple[str, str]]:
    """Pairs of slices on one track that overlap without one containing the other."""
    bad = []
    open_: list[dict] = []
    for e in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
        end = e["ts"] + e["dur"]
        while open_ and open_[-1]["ts"] + open_[-1]["dur"] <= e["ts"] + 1e-3:
            open_.pop()
        if open_ and end > open_[-1]["ts"] + open_[-1]["dur"] + 1e-3:
            bad.append((open_[-1]["name"], e["name"]))
        open_.append(e)
    return bad


@pytest.mark.parametrize("which", ["eager_profile", "graph_profile"])
def test_chrome_trace_is_a_valid_trace_on_every_track(which, request):
    """Issue #45: what a trace viewer needs: every slice has ph/ts/dur/pid/tid and a name,
    and on one track (pid, tid) two slices either do not overlap or one holds the other
    (Perfetto and chrome://tracing draw anything else as a broken stack)."""
    trace = chrome_trace(request.getfixturevalue(which))
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert slices
    for e in slices:
        assert {"ph", "ts", "dur", "pid", "tid", "name"} <= e.keys(), e
        assert isinstance(e["ts"], (int, float))
        assert e["dur"] >= 0
    tracks: dict[tuple, list[dict]] = {}
    for e in slices:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for track, items in tracks.items():
        assert _overlaps_without_nesting(items) == [], track


def test_the_track_check_fails_a_broken_stack():
    a, b = {"name": "a", "ts": 0.0, "dur": 10.0}, {"name": "b", "ts": 5.0, "dur": 10.0}
    inner = {"name": "inner", "ts": 2.0, "dur": 3.0}
    assert _overlaps_without_nesting([a, b]) == [("a", "b")]
    assert _overlaps_without_nesting([a, inner]) == []
    assert _overlaps_without_nesting([a, {"name": "c", "ts": 10.0, "dur": 1.0}]) == []
