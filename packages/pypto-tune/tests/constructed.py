"""Profiles built in the test with known operator timings (no profiler, no clock).

What a detector decides from a profile is arithmetic on its figures; a test of that
logic must not depend on how fast the machine ran a step. These builders give the
figures exactly, so the detectors' verdicts are asserted at any machine speed.
"""

from __future__ import annotations

from typing import Any

from pypto_tune import OpStat, Profile

#: A device whose probes measured 1 TFLOP/s and 100 GB/s, 1 us per empty launch.
PEAKS = {"matmul_flops_per_s": 1e12, "bandwidth_bytes_per_s": 1e11, "op_launch_us": 1.0}


def matmul_op(
    m: int,
    k: int,
    n: int,
    *,
    us: float,
    calls: float = 1.0,
    batch: int = 1,
    module: str = "model.layers.0.mlp.up_proj",
    elem: int = 4,
) -> OpStat:
    """One matmul operator taking ``us`` per step: aten::mm, or aten::bmm for ``batch``>1."""
    if batch > 1:
        name, shapes = "aten::bmm", [[batch, m, k], [batch, k, n]]
    else:
        name, shapes = "aten::mm", [[m, k], [k, n]]
    return OpStat(
        name=name,
        module=module,
        block="mlp",
        layer=0,
        calls=calls,
        host_us=us,
        self_us=us,
        device_us=us,
        shapes=shapes,
        dtypes=["float", "float"],
        flops=2.0 * batch * m * n * k * calls,
        bytes=float(batch * (m * k + k * n + m * n) * elem) * calls,
    )


def make_profile(
    ops: list[OpStat],
    *,
    step_us: float = 1000.0,
    regime: str = "prefill",
    batch: int | None = None,
    device_type: str = "cpu",
    peaks: dict[str, Any] | None = None,
    **meta: Any,
) -> Profile:
    """A profile of one step of ``step_us`` made of ``ops`` (device busy = their sum)."""
    busy = sum(o.device_us if device_type != "cpu" else o.self_us for o in ops)
    blocks: dict[str, dict[str, float]] = {}
    for o in ops:
        blocks.setdefault(o.block, {"us": 0.0, "share": 0.0})["us"] += o.self_us
    blocks["host gaps"] = {"us": max(step_us - busy, 0.0), "share": 0.0}
    for b in blocks.values():
        b["share"] = b["us"] / step_us
    return Profile(
        meta={
            "regime": regime,
            "arm": "eager",
            "device": device_type,
            "device_type": device_type,
            "dtype": "float32",
            "level": "detail",
            "batch": batch,
            "seq": 8,
            "gen": 4,
            "model": {"class": "Constructed", "parameters": 1000},
            "bench_config": {"model_path": "/models/constructed", "arms": ["eager", "graph"]},
            **meta,
        },
        peaks=dict(PEAKS if peaks is None else peaks),
        step={
            "count": 4,
            "unit": "one forward" if regime != "decode" else "decode step (one token)",
            "time_us": {
                "mean": step_us,
                "median": step_us,
                "min": step_us,
                "max": step_us,
                "stdev": 0.0,
            },
            "device_busy_us": busy,
            "host_gap_us": max(step_us - busy, 0.0),
            "utilisation": busy / step_us,
            "host_syncs": 0.0,
            "launch_us": 1.0,
            "compiled_regions": 0,
            "critical_path": {"bound": "device", "device_us": busy, "host_us": 0.0},
        },
        ops=ops,
        blocks=blocks,
        call_graph=[
            {
                "module": o.module,
                "class": "Linear",
                "parent": "",
                "block": o.block,
                "layer": 0,
                "us": o.self_us,
                "calls": o.calls,
            }
            for o in ops
            if o.module
        ],
        counters={
            "graph_breaks": {},
            "graph_break_count": 0,
            "graphs_compiled": 0,
            "frames_traced": 0,
            "warmup": {"graph_breaks": {}, "graph_break_count": 0},
        },
        memory={"kind": "process resident set (RSS)", "per_iter": [100, 100], "growth": 0},
    )
