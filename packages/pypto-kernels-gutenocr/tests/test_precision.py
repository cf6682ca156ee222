"""Precision cases from the package's JSON, against fp32 goldens on the CPU.

Each case runs twice: the fallback (torch reference through the wrapper, with the
CPU PyPTO path disabled, so the fallback itself is what is checked), and the PyPTO
kernel through the CPU SIM + verify path, at full shapes or at the reduced shapes
the case declares (the test id says which). The SIM runs happen in one child process
for the whole module (:mod:`pypto_kernels_common.precision_child`): in this process they
left ~1.1 GB of PyPTO's native memory behind for the rest of the suite.
"""

import pytest
import torch

from pypto_kernels_common.precision_child import run_cases_in_child
from pypto_kernels_gutenocr import precision, pto_switches, stats

CASES = precision.load_cases()
IDS = [c.id for c in CASES]


def test_cases_document_matches_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(precision.load_document(), precision.load_schema())
    assert len(set(IDS)) == len(IDS)
    assert {c.op for c in CASES} == {"rms_norm", "mrope", "swiglu_mlp"}


def test_cases_cover_the_real_model_shapes():
    shapes = {c.id: {k: v.get("shape") for k, v in c.inputs.items()} for c in CASES}
    assert shapes["rms_norm.decode"]["hidden_states"] == [1, 1, 2048]
    assert shapes["mrope.prefill.s64"]["q"] == [1, 16, 64, 128]
    assert shapes["mrope.prefill.s64"]["cos"] == [3, 1, 64, 128]
    # Per-head q_norm / k_norm (16 query heads, 8 key heads, head_dim 128).
    assert shapes["rms_norm.q_norm.per_head.s64"]["hidden_states"] == [1, 64, 16, 128]
    assert shapes["rms_norm.k_norm.per_head.s64"]["hidden_states"] == [1, 64, 8, 128]
    for n in (1, 8, 16, 64):
        s = shapes[f"swiglu_mlp.n{n}"]
        assert s["x"] == [n, 2048]
        assert s["w_gate"] == [2048, 11008]
        assert s["w_down"] == [11008, 2048]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fallback_matches_golden(case, monkeypatch):
    monkeypatch.setenv("PYPTO_GUTENOCR_CPU_SIM", "0")
    inputs = precision.make_inputs(case)
    with pto_switches({case.op: True}):
        got = precision.run_kernel(case, inputs)
    precision.compare(case, got, precision.golden(case, inputs))
    assert stats.calls()[case.op] == {"pypto": 0, "reference": 1}


@pytest.fixture(scope="module")
def sim_rows():
    """Every case through the PyPTO kernel (CPU SIM + verify, reduced inputs where the case
    declares them), all in one child process: id -> its row."""
    pytest.importorskip("pypto")
    return run_cases_in_child("pypto_kernels_gutenocr.precision", IDS, timeout_s=900)


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
    # The kernel really computed (the 0.2.0 defect yields all zeros).
    for name in case.outputs:
        assert row["outputs"][name]["max_abs_value"] > 0, name
    assert set(row["max_abs"]) == set(case.outputs)
    assert all(e >= 0 for e in row["max_abs"].values())
    # The per-call cost-model folders (1-170 MB each) of the child's pid are not left behind.
    assert not row["leftover_outputs"], row["leftover_outputs"]


def test_make_inputs_is_deterministic_per_seed():
    case = CASES[0]
    a, b = precision.make_inputs(case), precision.make_inputs(case)
    assert torch.equal(a["hidden_states"], b["hidden_states"])


@pytest.mark.parametrize(
    "case_id", ["rms_norm.q_norm.per_head.s64", "rms_norm.k_norm.per_head.s64"]
)
def test_per_head_norm_cases_are_inside_the_rms_norm_envelope(case_id):
    """They reach the PyPTO kernel (rows = S x heads, hidden = head_dim), not a fallback."""
    from pypto_kernels_gutenocr import ENVELOPES

    case = next(c for c in CASES if c.id == case_id)
    inputs = precision.make_inputs(case)
    assert ENVELOPES["rms_norm"].violation([inputs["hidden_states"], inputs["weight"]]) is None
