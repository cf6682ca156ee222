"""Run one precision case through the op and compare with its golden, in this process;
print one JSON line. The tests run it as a child process per case: in one process the
cases' weights, goldens and PyPTO's verify copies left 10.4 GB resident (14.8 GB at the
peak), which the rest of the suite's process then carried (a full run was killed for
memory here)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

__all__ = ["main"]


def main(case_id: str) -> int:
    from pypto_kernels_common import precision, sim

    sim.use_run_folders(Path(tempfile.mkdtemp(prefix="pypto-moe-precision-")))
    sim.prepare_environment()
    from pypto_kernels_common.precision import make_inputs
    from pypto_kernels_moe import PACKAGE
    from pypto_kernels_moe import precision as suite

    case = next(c for c in suite.load_cases() if c.id == case_id)
    row: dict[str, object] = {"id": case.id}
    try:
        inputs = make_inputs(case, reduced=True)
        got = suite.run_kernel(case, inputs)
        row["calls"] = PACKAGE.stats.calls()["grouped_gemm"]
        row["max_abs"] = precision.compare(case, got, suite.golden(case, inputs))
        row["ok"] = True
    except Exception as err:
        row["ok"] = False
        row["error"] = f"{type(err).__name__}: {err}"
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
