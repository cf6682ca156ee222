"""The precision cases: schema-valid, and the kernel within tolerance of the fp32 golden."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_kernels_common import precision
from pypto_kernels_common.precision import make_inputs
from pypto_kernels_moe import precision as suite


def test_cases_follow_the_one_schema():
    jsonschema = pytest.importorskip("jsonschema")
    doc = suite.load_document()
    jsonschema.validate(doc, precision.load_schema())
    cases = suite.load_cases()
    assert {c.op for c in cases} == {"grouped_gemm"}
    assert any("minimax_m2" in c.id for c in cases)
    assert any("llada2" in c.id for c in cases)


@pytest.mark.exclusive(reason="builds every case's full inputs in this process: 6.8 GB at the peak")
def test_routing_gives_distinct_ids_per_token():
    for case in suite.load_cases():
        inputs = make_inputs(case, reduced=True)
        ids, _ = suite.route(inputs["router_logits"], inputs["top_k"])
        assert all(len(set(row)) == len(row) for row in ids.tolist()), case.id


@pytest.mark.slow
@pytest.mark.exclusive(reason="the case's child holds up to 11 GB (LLaDA2-mini prefill s512)")
@pytest.mark.parametrize("case", suite.load_cases(), ids=lambda c: c.id)
def test_kernel_matches_golden(case):
    """The case in its own process (``_precision_child.py``): the kernel through the op,
    compared with the fp32 golden within the case's tolerances."""
    pytest.importorskip("pypto")
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("_precision_child.py")), case.id],
        capture_output=True,
        text=True,
        timeout=900,
    )
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert rows, done.stderr[-3000:]
    row = rows[-1]
    assert row["ok"], row.get("error")
    assert row["calls"]["pypto"] == 1, row
