"""The precision cases: schema-valid, at the published layer shapes, and the kernel within
tolerance of the fp32 golden (fp32: transformers' order, a few ulps; bf16: the io-dtype
roundings transformers makes, about two bf16 ulps of the output)."""

from __future__ import annotations

import pytest

from pypto_kernels_common import precision
from pypto_kernels_common.precision_child import run_cases_in_child
from pypto_kernels_linear_attention import precision as suite


def test_cases_follow_the_one_schema_at_the_published_shapes():
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(suite.load_document(), precision.load_schema())
    cases = {c.id: c for c in suite.load_cases()}
    shapes = {cid.split(".")[1]: c.inputs["state"]["shape"][1:] for cid, c in cases.items()}
    assert shapes == {
        "qwen3_5_9b": [32, 128, 128],
        "qwen3_6_27b": [48, 128, 128],
        "kimi_linear_48b_a3b": [32, 128, 128],
    }
    assert all(c.cpu_path["shapes"] == "full" for c in cases.values())
    assert {c.id.rsplit(".", 1)[1] for c in cases.values()} == {"bf16", "fp32"}


@pytest.fixture(scope="module")
def results():
    """Every case run once through the op on the CPU SIM + verify shim, at full shapes, in
    one child process (:mod:`pypto_kernels_common.precision_child`: the full-shape SIM runs
    leave about a gigabyte of PyPTO state behind, which must not stay in this process):
    id -> its row."""
    pytest.importorskip("pypto")
    ids = [c.id for c in suite.load_cases()]
    return run_cases_in_child(
        "pypto_kernels_linear_attention.precision", ids, timeout_s=900, reduced=False
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", suite.load_cases(), ids=lambda c: c.id)
def test_kernel_matches_golden(results, case):
    row = results.get(case.id)
    assert row is not None, sorted(results)
    assert row["ok"], row["error"]
    assert row["calls"] == {"pypto": 1, "reference": 0}, row
    # the state moved: a kernel that left it alone would fail here
    assert row["moved"] == {"state": True}, row
    assert set(row["max_abs"]) == {"y", "state"}, row
