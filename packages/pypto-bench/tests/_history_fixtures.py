"""Constructed bench reports (no model runs) for the verdict and history tests.

``make_report(eager=[...], graph=[...])`` builds a real ``Report`` (the dataclass the
bench writes) whose arms carry exactly these tok/s samples, so the tests pick the
intervals and know the verdict in advance. Also run as a script by the concurrent-writer
tests: ``python _history_fixtures.py DB N TAG`` records N reports.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

__all__ = ["make_report", "report_dict"]


def _stats(samples: list[float]) -> dict[str, Any]:
    return {
        "samples": samples,
        "best": max(samples),
        "median": statistics.median(samples),
        "mean": statistics.fmean(samples),
        "stdev": statistics.stdev(samples) if len(samples) > 1 else 0.0,
    }


def make_report(
    *,
    eager: list[float] | None = None,
    graph: list[float] | None = None,
    created_at: str = "2026-12-01T00:00:00+00:00",
    model_path: str = "/models/tiny",
    regime: str = "decode",
    batch: int = 1,
    seq: int = 16,
    gen: int = 8,
    device: tuple[str, str] = ("cpu", "x86_64 test cpu"),
    dtype: str = "float32",
    torch_version: str = "2.13.0",
    transformers_version: str = "5.24.0",
    host: str = "host-a",
) -> Any:
    from pypto_bench.config import BenchConfig
    from pypto_bench.report import SCHEMA_VERSION, ArmResult, Report

    arms = []
    for name, samples in (("eager", eager or [100.0, 101.0, 99.0, 100.5, 99.5]), ("graph", graph)):
        if samples is None:
            continue
        tokens = 7 * batch
        arms.append(
            ArmResult(
                name=name,
                tokens_per_s=_stats(samples),
                seconds=_stats([tokens / s for s in samples]),
                tokens_per_iter=[tokens] * len(samples),
            )
        )
    report = Report(
        schema_version=SCHEMA_VERSION,
        tool={"name": "pypto-bench", "version": "test"},
        created_at=created_at,
        command_line=["pypto-bench", "run"],
        environment={
            "python": "3.11",
            "platform": "linux",
            "host": host,
            "cpu": "test cpu",
            "versions": {
                "torch": torch_version,
                "transformers": transformers_version,
                "torch_npu": None,
                "cann": None,
                "pypto": None,
                "pypto_bench": "test",
                "pypto_capture": "test",
            },
            "device": {"spec": device[0], "type": device[0], "name": device[1]},
            "env": {},
        },
        config=BenchConfig(
            model_path=model_path,
            regime=regime,
            batch=batch,
            seq=seq,
            gen=gen,
            dtype=dtype,
            device=device[0],
            arms=tuple(a.name for a in arms),
        ).to_dict(),
        regime=regime,
        model={
            "path": model_path,
            "class": "LlamaForCausalLM",
            "model_type": "llama",
            "dtype": dtype,
            "parameters": 1000,
            "load_s": 0.1,
            "load_memory": {},
        },
        arms=arms,
    )
    report.finish()
    return report


def report_dict(**kwargs: Any) -> dict[str, Any]:
    result: dict[str, Any] = make_report(**kwargs).to_dict()
    return result


if __name__ == "__main__":  # a writer process: python _history_fixtures.py DB N TAG
    from pypto_bench.history import record

    db, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    for i in range(n):
        rid = record(
            db,
            make_report(
                created_at=f"2026-12-01T00:00:{i % 60:02d}+00:00",
                host=f"{tag}-{i}",
                graph=[150.0 + i, 151.0, 149.0],
            ),
        )
        print(rid, flush=True)
