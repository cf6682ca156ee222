"""The one precision-case schema and its helpers."""

from __future__ import annotations

import json

import pytest
import torch

from pypto_kernels_common import precision

DOC = {
    "schema_version": 1,
    "cases": [
        {
            "id": "gather.decode",
            "op": "gather",
            "description": "rows of x picked by ids (an op with integer inputs)",
            "seed": 3,
            "inputs": {
                "x": {"shape": [8, 64], "dtype": "bfloat16"},
                "ids": {"shape": [4], "dtype": "int64", "init": "randint", "low": 0, "high": 8},
                "scale": {"value": 2.0},
            },
            "outputs": ["y"],
            "rtol": 0.01,
            "atol": 0.01,
            "cpu_path": {
                "shapes": "reduced",
                "why": "SIM time",
                "inputs": {"x": {"shape": [8, 64], "dtype": "bfloat16", "std": 0.5}},
            },
        }
    ],
}


def _gather(kernel: bool):
    def run(x, ids, scale):
        return {"y": x[ids] * scale}

    return run


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A real importable package with a cases resource (what PrecisionSuite reads)."""
    root = tmp_path / "cases_pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "precision_cases.json").write_text(json.dumps(DOC))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "cases_pkg"


def test_the_schema_takes_integer_inputs_and_refuses_mismatched_ones():
    jsonschema = pytest.importorskip("jsonschema")
    schema = precision.load_schema()
    jsonschema.validate(DOC, schema)
    bad_specs = [
        {"shape": [4], "dtype": "int64"},  # int without randint: would truncate normals
        {"shape": [4], "dtype": "float32", "init": "randint", "high": 3},  # randint of floats
        {"shape": [4], "dtype": "int32", "init": "randint"},  # no upper bound
        {"shape": [4], "dtype": "float64"},
    ]
    for spec in bad_specs:
        doc = json.loads(json.dumps(DOC))
        doc["cases"][0]["inputs"]["ids"] = spec
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema)
    doc = json.loads(json.dumps(DOC))
    doc["cases"][0]["op"] = "Bad Op"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)


def test_suite_loads_runs_goldens_and_compares(pkg):
    suite = precision.PrecisionSuite(pkg, {"gather": _gather})
    (case,) = suite.load_cases()
    assert case.reduced
    inputs = precision.make_inputs(case, reduced=True)
    assert inputs["ids"].dtype == torch.int64
    assert int(inputs["ids"].max()) < 8
    assert inputs["x"].dtype == torch.bfloat16
    assert torch.equal(precision.make_inputs(case, reduced=True)["x"], inputs["x"])
    want = suite.golden(case, inputs)
    assert want["y"].dtype == torch.float32  # fp32 golden; the ids stayed integers
    errs = precision.compare(case, suite.run_kernel(case, inputs), want)
    assert errs["y"] <= 0.01
    with pytest.raises(AssertionError, match=r"^gather.decode/y: "):
        precision.compare(case, {"y": want["y"] + 1}, want)


def test_named_inputs_equal_the_full_set_and_stop_after_the_last_named(pkg, monkeypatch):
    suite = precision.PrecisionSuite(pkg, {"gather": _gather})
    (case,) = suite.load_cases()
    full = precision.make_inputs(case, reduced=True)
    drawn = []
    real_randint = torch.randint
    monkeypatch.setattr(
        torch, "randint", lambda *a, **k: drawn.append("ids") or real_randint(*a, **k)
    )
    only_x = precision.make_inputs(case, reduced=True, names=["x"])
    assert list(only_x) == ["x"]
    assert torch.equal(only_x["x"], full["x"])
    assert drawn == []  # ids come after x: not drawn
    some = precision.make_inputs(case, reduced=True, names={"ids", "scale"})
    assert list(some) == ["ids", "scale"]  # the case's order, x drawn but not returned
    assert torch.equal(some["ids"], full["ids"])
    assert some["scale"] == 2.0
    with pytest.raises(KeyError, match=r"gather.decode: no inputs named \['w'\]"):
        precision.make_inputs(case, names=["x", "w"])


def test_a_case_without_a_runner_is_named(pkg):
    with pytest.raises(ValueError, match=r"no runner for ops \['gather'\]"):
        precision.PrecisionSuite(pkg, {}).load_cases()
