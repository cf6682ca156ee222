"""The NPU side of --nproc that runs here: reading HCCL spans back from torch_npu's
trace_view.json (the layout its profiler writes: process rows named by "M" events, HCCL
operators as "X" spans named hcom_*), defensively. The run itself needs 2 Ascend NPUs."""

from __future__ import annotations

import importlib.util
import json

import pytest

from pypto_bench.multi.comm import hccl_spans, union_of_spans


def _trace(tmp_path, events):
    path = tmp_path / "trace_view.json"
    path.write_text(json.dumps(events))
    return path


def test_hccl_operator_spans_are_read_from_the_communication_rows(tmp_path):
    events = [
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "HCCL"}},
        {"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "Ascend Hardware"}},
        {
            "ph": "X",
            "name": "hcom_allReduce__512_0_1",
            "pid": 7,
            "tid": 0,
            "ts": "100.5",
            "dur": 20,
        },
        {"ph": "X", "name": "hcom_allReduce__512_1_1", "pid": 7, "tid": 0, "ts": 110, "dur": 30},
        {
            "ph": "X",
            "name": "Notify_Wait",
            "pid": 7,
            "tid": 1,
            "ts": 100,
            "dur": 90,
        },  # a task, not an op
        {
            "ph": "X",
            "name": "hcom_allGather_",
            "pid": 3,
            "tid": 0,
            "ts": 0,
            "dur": 5,
        },  # not an HCCL row
        {"ph": "X", "name": "hcom_broadcast_", "pid": 7, "ts": "bad", "dur": 1},
        {"ph": "X", "name": "hcom_broadcast_", "pid": 7, "ts": 1},  # no duration
        "not an event",
    ]
    spans = hccl_spans(_trace(tmp_path, {"traceEvents": events}))
    assert spans == [(100.5, 120.5), (110.0, 140.0)]
    assert union_of_spans(spans) == (39.5, 1)  # overlapping operators count once


@pytest.mark.parametrize("payload", [42, {"traceEvents": "x"}, []])
def test_a_trace_of_the_wrong_shape_gives_no_spans(tmp_path, payload):
    assert hccl_spans(_trace(tmp_path, payload)) == []


def _two_npus() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch
    import torch_npu  # noqa: F401

    return torch.npu.device_count() >= 2


@pytest.mark.npu
@pytest.mark.skipif(not _two_npus(), reason="needs torch_npu and 2 Ascend NPUs (none here)")
def test_hccl_graph_decode_and_share_on_two_npus(tiny_llama, tmp_path):
    from pypto_bench import BenchConfig
    from pypto_bench.multi import run_distributed

    config = BenchConfig(
        model_path=str(tiny_llama), device="npu", regime="decode", arms=("eager", "graph"),
        nproc=2, seq=4, gen=3, warmup=1, iters=1, dtype="float32", measure_bandwidth=False,
    )  # fmt: skip
    report = run_distributed(config, state_dir=tmp_path / "state")
    assert report.distributed["arms"]["graph"]["agreement"]["token_match"]["rate"] == 1.0
    comm = report.distributed["ranks"][0]["communication"]
    assert comm["share"] is not None
    assert "hcom" in comm["method"]
