"""`pypto-bench compare A B`: verdicts from intervals, refusals per differing field."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pypto_bench import EXIT
from pypto_bench.cli import main
from pypto_bench.errors import CompareMismatchError
from pypto_bench.verdicts import FINGERPRINT_FIELDS, verdicts

sys.path.insert(0, str(Path(__file__).parent))
from _history_fixtures import report_dict

STEADY = [150.0, 151.0, 149.0, 150.5, 149.5]


def _write(tmp_path, name, **kwargs):
    path = tmp_path / name
    path.write_text(json.dumps(report_dict(**kwargs)))
    return str(path)


def _rows(doc):
    return {(r["arm"], r["measure"]): r["verdict"] for r in doc["verdicts"]["rows"]}


@pytest.mark.parametrize(
    ("graph_b", "expected"),
    [
        ([180.0, 181.0, 179.0, 180.5, 179.5], "faster"),
        ([120.0, 121.0, 119.0, 120.5, 119.5], "slower"),
        # the point estimate moved (150 -> 151) but the intervals overlap: no change
        ([151.0, 149.0, 153.0, 148.0, 152.0], "no change"),
    ],
)
def test_cli_verdicts_from_intervals(tmp_path, capsys, graph_b, expected):
    a = _write(tmp_path, "a.json", graph=STEADY)
    b = _write(tmp_path, "b.json", graph=graph_b)
    assert main(["compare", a, b, "--json"]) == EXIT.OK
    doc = json.loads(capsys.readouterr().out)
    rows = _rows(doc)
    assert rows[("graph", "tok/s")] == expected
    assert rows[("graph", "x eager")] == expected
    assert rows[("eager", "tok/s")] == "no change"
    assert main(["compare", a, b]) == EXIT.OK
    out = capsys.readouterr().out
    assert f"graph        tok/s         {expected}" in out


_DIFFERENT = {
    "model": {"model_path": "/models/other"},
    "regime": {"regime": "prefill"},
    "shapes": {"batch": 4},
    "device": {"device": ("cuda", "H200")},
    "dtype": {"dtype": "bfloat16"},
    "versions": {"transformers_version": "5.25.0"},
}


@pytest.mark.parametrize("what", FINGERPRINT_FIELDS)
def test_cli_refuses_what_differs_unless_allowed(tmp_path, capsys, what):
    assert set(_DIFFERENT) == set(FINGERPRINT_FIELDS)
    a = _write(tmp_path, "a.json", graph=STEADY)
    b = _write(tmp_path, "b.json", graph=STEADY, **_DIFFERENT[what])
    assert main(["compare", a, b]) == EXIT.USAGE
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("pypto-bench:")]
    assert len(err) == 1, err
    assert f"differ in {what} (" in err[0]
    assert f"--allow-different {what}" in err[0]
    assert main(["compare", a, b, "--allow-different", what, "--json"]) == EXIT.OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdicts"]["allowed_differences"] == [what]
    assert doc["verdicts"]["differences"][0].startswith(f"{what}: ")
    assert _rows(doc)[("graph", "tok/s")] == "no change"
    assert main(["compare", a, b, "--force", "--json"]) == EXIT.OK
    capsys.readouterr()


def test_allow_different_unknown_name_and_library(tmp_path, capsys):
    a = _write(tmp_path, "a.json", graph=STEADY)
    b = _write(tmp_path, "b.json", graph=STEADY, dtype="float16", batch=2)
    assert main(["compare", a, b, "--allow-different", "colour"]) == EXIT.USAGE
    assert "unknown; pick from model" in capsys.readouterr().err
    with pytest.raises(CompareMismatchError, match="differ in dtype"):
        verdicts(
            json.loads(Path(a).read_text()),
            json.loads(Path(b).read_text()),
            allow_different=["shapes"],
        )
    got = verdicts(
        json.loads(Path(a).read_text()),
        json.loads(Path(b).read_text()),
        allow_different=["shapes", "dtype"],
    )
    assert {r["verdict"] for r in got.rows} == {"no change"}


def test_report_intervals_win_over_samples():
    """A report that carries its own interval (interleaved rounds) is judged by it."""
    a = report_dict(graph=STEADY)
    b = report_dict(graph=STEADY)
    for arm in b["arms"]:
        if arm["name"] == "graph":
            arm["ratio_vs_eager"] = {
                "median": 2.0,
                "low": 1.9,
                "high": 2.1,
                "rounds": 8,
                "method": "paired rounds",
            }
    rows = {(r["arm"], r["measure"]): r for r in verdicts(a, b).rows}
    assert rows[("graph", "x eager")]["verdict"] == "faster"
    assert rows[("graph", "x eager")]["b"]["method"] == "paired rounds"


def test_reports_without_intervals_are_judged_from_their_samples():
    """A report before 1.4 holds only samples: the intervals are built from them."""
    a, b = report_dict(graph=STEADY), report_dict(graph=[s * 0.8 for s in STEADY])
    for doc in (a, b):
        for arm in doc["arms"]:
            arm["tokens_per_s"].pop("interval", None)
            arm.pop("ratio_vs_eager", None)
            arm.pop("ratio_vs_peer", None)
    rows = {(r["arm"], r["measure"]): r for r in verdicts(a, b).rows}
    assert rows[("graph", "tok/s")]["verdict"] == "slower"
    assert rows[("graph", "x eager")]["verdict"] == "slower"
    assert "bootstrap" in rows[("graph", "x eager")]["b"]["method"]
    assert rows[("eager", "tok/s")]["verdict"] == "no change"


def _tuned(data, kinds):
    """The graph arm of a report dict as if max-autotune chose ``kinds`` (one per op)."""
    graph = next(a for a in data["arms"] if a["name"] == "graph")
    graph.setdefault("details", {})["autotune"] = {
        "recorded": True,
        "ops": [
            {"op": "packed_linear", "shapes": [[1, 64], [9, 1], [n, 64]],
             "chosen": f"{k}_{i}", "kind": k, "times_ms": {f"{k}_{i}": 0.1}}
            for i, (n, k) in enumerate(kinds)
        ],
    }  # fmt: skip
    return data


def test_a_different_autotune_choice_is_said_beside_the_verdicts(tmp_path, capsys):
    """Two runs whose graph arms compiled different kernels: the verdicts stand, with a
    note that they compare kernels as well as runs; the same kernels (indices aside): none."""
    cpp, mkl = "cpp_CppMicroGemmFP32Vec", "_mkl_linear"
    a = tmp_path / "a.json"
    a.write_text(json.dumps(_tuned(report_dict(graph=STEADY), [(64, cpp), (128, cpp)])))
    same = tmp_path / "same.json"
    same.write_text(json.dumps(_tuned(report_dict(graph=STEADY), [(64, cpp), (128, cpp)])))
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_tuned(report_dict(graph=STEADY), [(64, cpp), (128, mkl)])))
    assert main(["compare", str(a), str(same), "--json"]) == EXIT.OK
    assert json.loads(capsys.readouterr().out)["verdicts"]["notes"] == []
    assert main(["compare", str(a), str(other), "--json"]) == EXIT.OK
    (note,) = json.loads(capsys.readouterr().out)["verdicts"]["notes"]
    assert note.startswith("graph: the two compiles chose different kernels (1 of 2")
    assert f"{cpp} vs {mkl}" in note
    assert "--compile-mode default" in note
    assert main(["compare", str(a), str(other)]) == EXIT.OK
    assert "note: graph: the two compiles chose different kernels" in capsys.readouterr().out
