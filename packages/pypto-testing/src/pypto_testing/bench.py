"""The smallest bench run that proves a kernel plug-in inside the captured step.

Every kernels package proves its plug-in the same way: a tiny fp32 folder, decode (or
its regime) with a few tokens, no warmup, one iteration, eager vs graph vs pypto+graph,
then the fused arm's token match and the plug-in's call counts. One definition keeps
those proofs measuring the same thing.

The run is ``pypto-bench run`` in a child process that writes its JSON report: what the
PyPTO SIM kernels and three compiled arms take (1-2 GB each, kept by the allocator after
the run) leaves with the child instead of staying in the test process for the rest of
the suite (docs/testing.md), and the proof is the command a user runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["FUSED_ARMS", "bench_report", "fused_arm_run"]

FUSED_ARMS = ("eager", "graph", "pypto+graph")

#: seconds one child run may take before it is killed and the test fails with its output
RUN_TIMEOUT_S = 900.0


def bench_report(
    folder: str | Path,
    *,
    gen: int,
    regime: str = "decode",
    seq: int = 4,
    arms: tuple[str, ...] = FUSED_ARMS,
    iters: int = 1,
    extra: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
    trust_remote_code: bool = False,
    timeout_s: float = RUN_TIMEOUT_S,
) -> dict[str, Any]:
    """``pypto-bench run`` on ``folder`` in a child process (CPU, fp32, warmup 0); its report.

    ``extra`` is appended to the command line (``--schedule sequential``, ``--moe-routing
    static``, ...); ``env`` adds variables to the child's environment (this process's is
    left as it is). Raises RuntimeError (with the child's exit code and the tail of its
    output) when the child wrote no report: an arm that fails is in the report with its
    error, so the caller's assertions name it.
    """
    with tempfile.TemporaryDirectory(prefix="pypto-fused-arm-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [
            sys.executable, "-m", "pypto_bench", "run",
            "--model-path", str(folder),
            "--device", "cpu", "--dtype", "float32",
            "--regime", regime, "--seq", str(seq), "--gen", str(gen),
            "--warmup", "0", "--iters", str(iters),
            "--arms", ",".join(arms),
            "--no-bandwidth",
            "--report-file", str(report),
            *extra,
        ]  # fmt: skip
        if trust_remote_code:
            cmd.append("--trust-remote-code")
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **(env or {})},
            check=False,
        )
        if not report.is_file():
            raise RuntimeError(
                f"pypto-bench run exited {proc.returncode} with no report:\n"
                f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
            )
        data: dict[str, Any] = json.loads(report.read_text(encoding="utf-8"))
    return data


def fused_arm_run(
    folder: str | Path,
    *,
    gen: int,
    regime: str = "decode",
    seq: int = 4,
    arms: tuple[str, ...] = FUSED_ARMS,
    trust_remote_code: bool = False,
    timeout_s: float = RUN_TIMEOUT_S,
) -> dict[str, dict[str, Any]]:
    """Run the arms on ``folder`` (CPU, fp32, warmup 0, one iteration); the report's arms by
    name (:func:`bench_report`)."""
    data = bench_report(
        folder,
        gen=gen,
        regime=regime,
        seq=seq,
        arms=arms,
        trust_remote_code=trust_remote_code,
        timeout_s=timeout_s,
    )
    return {a["name"]: a for a in data["arms"]}
