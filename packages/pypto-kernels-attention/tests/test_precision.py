"""Precision cases from the package's JSON, against fp32 goldens on the CPU.

Each case runs as the fallback (the reference through the wrapper, the CPU PyPTO path
disabled) and, marked slow, as the PyPTO kernel through the CPU SIM + verify path at
full shapes or the reduced shapes the case declares (the test id says which). The SIM
runs happen in one child process for the whole module
(:mod:`pypto_kernels_common.precision_child`): in this process they left ~1.6 GB of
PyPTO's native memory behind for the rest of the suite.
"""

from __future__ import annotations

import pytest

from pypto_kernels_attention.package import PACKAGE
from pypto_kernels_attention.precision import SUITE, compare, make_inputs
from pypto_kernels_common.precision import load_schema
from pypto_kernels_common.precision_child import run_cases_in_child

CASES = SUITE.load_cases()
IDS = [c.id for c in CASES]


def test_cases_document_matches_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(SUITE.load_document(), load_schema())
    assert len(set(IDS)) == len(IDS)
    assert {c.op for c in CASES} == {"gqa_decode", "softmax"}


def test_cases_use_the_gemma4_31b_shapes():
    shapes = {c.id: {k: v.get("shape") for k, v in c.inputs.items()} for c in CASES}
    sliding = shapes["gqa_decode.sliding.w1024.bf16"]
    assert sliding["q"] == [1, 32, 1, 256]
    assert sliding["k"] == [1, 16, 1024, 256]
    full = shapes["gqa_decode.full.d512"]
    assert full["q"] == [1, 32, 1, 512]
    assert full["k"] == [1, 4, 4096, 512]
    assert shapes["softmax.decode.s1024.bf16"]["scores"] == [1, 32, 1, 1024]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fallback_matches_golden(case, monkeypatch):
    monkeypatch.setenv("PYPTO_ATTENTION_CPU_SIM", "0")
    inputs = make_inputs(case)
    with PACKAGE.switches.pto_switches({case.op: True}):
        got = SUITE.run_kernel(case, inputs)
    compare(case, got, SUITE.golden(case, inputs))
    assert PACKAGE.stats.calls()[case.op] == {"pypto": 0, "reference": 1}


@pytest.fixture(scope="module")
def sim_rows():
    """Every case through the PyPTO kernel (CPU SIM + verify, reduced inputs where the case
    declares them), all in one child process: id -> its row."""
    pytest.importorskip("pypto")
    return run_cases_in_child("pypto_kernels_attention.precision", IDS, timeout_s=900)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c.id}[{'reduced' if c.reduced else 'full'}]" for c in CASES]
)
def test_pypto_kernel_matches_golden(case, sim_rows):
    row = sim_rows[case.id]
    assert row["calls"] == {"pypto": 1, "reference": 0}, (
        row["fallback_reasons"],
        row["error"],
    )
    assert row["ok"], row["error"]  # compare() within the case's tolerances
    for name in case.outputs:  # the kernel really computed (the 0.2.0 defect yields zeros)
        assert row["outputs"][name]["max_abs_value"] > 0, name
