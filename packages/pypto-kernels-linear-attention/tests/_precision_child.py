"""Run every precision case through the op and compare with its golden, in this process;
print one JSON line per case. The tests run it as a child process: the full-shape SIM runs
leave about a gigabyte of PyPTO state behind, which must not stay in the test process."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

__all__ = ["main"]


def main() -> int:
    from pypto_kernels_common import precision, sim

    sim.use_run_folders(Path(tempfile.mkdtemp(prefix="pypto-linear-attention-precision-")))
    sim.prepare_environment()
    from pypto_kernels_common.precision import make_inputs
    from pypto_kernels_linear_attention import PACKAGE
    from pypto_kernels_linear_attention import precision as suite

    for case in suite.load_cases():
        PACKAGE.stats.reset()
        inputs = make_inputs(case)
        row: dict[str, object] = {"id": case.id}
        try:
            got = suite.run_kernel(case, inputs)
            row["calls"] = PACKAGE.stats.calls()[case.op]
            row["state_moved"] = not inputs["state"].equal(got["state"])
            row["max_abs"] = precision.compare(case, got, suite.golden(case, inputs))
            row["ok"] = True
        except Exception as err:
            row["ok"] = False
            row["error"] = f"{type(err).__name__}: {err}"
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
