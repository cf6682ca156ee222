"""The smallest bench run that proves a kernel plug-in inside the captured step.

Every kernels package proves its plug-in the same way: a tiny fp32 folder, decode (or
its regime) with a few tokens, no warmup, one iteration, eager vs graph vs pypto+graph,
then the fused arm's token match and the plug-in's call counts. One definition keeps
those proofs measuring the same thing. pypto-bench is imported when called (the hub and
the model builders do not need it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["FUSED_ARMS", "fused_arm_run"]

FUSED_ARMS = ("eager", "graph", "pypto+graph")


def fused_arm_run(
    folder: str | Path,
    *,
    gen: int,
    regime: str = "decode",
    seq: int = 4,
    arms: tuple[str, ...] = FUSED_ARMS,
    trust_remote_code: bool = False,
) -> dict[str, dict[str, Any]]:
    """Run the arms on ``folder`` (CPU, fp32, warmup 0, one iteration); the report's arms by name."""
    from pypto_bench import BenchConfig, run_bench

    report = run_bench(
        BenchConfig(
            model_path=str(folder),
            device="cpu",
            regime=regime,
            seq=seq,
            gen=gen,
            warmup=0,
            iters=1,
            dtype="float32",
            arms=arms,
            trust_remote_code=trust_remote_code,
            measure_bandwidth=False,
        )
    )
    return {a["name"]: a for a in report.to_dict()["arms"]}
