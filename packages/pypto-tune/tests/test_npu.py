"""The Ascend path of pypto-tune, on a CPU: reading torch_npu.profiler output folders.

The folders are built in the formats torch_npu writes (trace_view.json as its
TraceEventManager emits it, kernel_details.csv / op_statistic.csv with its headers), so
the reader is tested against real files, hostile ones included. Recording itself needs an
Ascend NPU and is tested only where one is present.
"""

from __future__ import annotations

import csv
import json
import os
import stat
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from pypto_capture import npu_available
from pypto_tune import EXIT, BadInputError, EnvironmentMissingError, ProfileFormatError, npu
from pypto_tune.npu import (
    NPU_API,
    NpuProfilerSession,
    operator_tuning_config,
    read_ascend_output,
    run_msprof_advisor,
)

HOST, HW = 1000, 2000  # pids of the "Python" and "Ascend Hardware" processes
KERNEL_HEADER = [
    "Step Id", "Model ID", "Task ID", "Stream ID", "Name", "Type", "OP State", "Accelerator Core",
    "Start Time(us)", "Duration(us)", "Wait Time(us)", "Block Dim", "Mix Block Dim",
    "Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types",
    "Output Formats", "aic_time(us)", "aic_mac_ratio", "aic_mte2_ratio", "aiv_vec_ratio",
]  # fmt: skip
KERNELS = [
    # The matmul runs on the device long after aten::mm was launched (and after the
    # module scope ended): only the async_npu flow ties it to the mlp.
    ["0", "4294967295", "11", "2", "aclnnMm_MatMulCommon_MatMulV2", "MatMulV2", "static", "AI_CORE",
     "1200.000\t", "80.5", "1.2", "20", "0", '"1,4096;4096,11008"', "DT_BF16;DT_BF16", "ND;ND",
     '"1,11008"', "DT_BF16", "ND", "79.9", "0.85", "0.40", "N/A"],
    ["0", "4294967295", "12", "2", "IndexPut", "IndexPut", "dynamic", "AI_CPU", "1300.123", "25",
     "0", "1", "0", '"8,128;8;8,128"', "FLOAT;INT64;FLOAT", "ND;ND;ND", '"8,128"', "FLOAT", "ND",
     "N/A", "N/A", "N/A", "N/A"],
    ["0", "4294967295", "13", "2", "Cast", "Cast", "static", "AI_VECTOR_CORE", "400.0", "3", "0",
     "8", "0", '"4096"', "FLOAT16", "ND", '"4096"', "FLOAT", "ND", "N/A", "N/A", "N/A", "0.2"],
]  # fmt: skip
OP_STAT_HEADER = ["OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)",
                  "Avg Time(us)", "Max Time(us)", "Ratio(%)"]  # fmt: skip


def _x(
    name: str, ts: Any, dur: Any, pid: int = HOST, tid: int = 7, cat: str = "cpu_op", **args: Any
) -> dict:
    return {
        "ph": "X",
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "cat": cat,
        "args": args,
    }


def _flow(fid: int, host_ts: Any, dev_ts: Any) -> list[dict]:
    """One torch_to_npu flow exactly as torch_npu's TraceEventManager writes it."""
    common = {"bp": "e", "name": "torch_to_npu", "id": fid, "cat": "async_npu"}
    return [
        {"ph": "s", "pid": HOST, "tid": 7, "ts": host_ts, **common},
        {"ph": "f", "pid": HW, "tid": 2, "ts": dev_ts, **common},
    ]


def trace_events() -> list[dict]:
    meta = [
        {"ph": "M", "name": "process_name", "pid": HOST, "tid": 0, "args": {"name": "Python"}},
        {
            "ph": "M",
            "name": "process_name",
            "pid": HW,
            "tid": 0,
            "args": {"name": "Ascend Hardware"},
        },
        {"ph": "M", "name": "process_name", "pid": 3000, "tid": 0, "args": {"name": "CANN"}},
    ]
    host = [
        _x("ProfilerStep#0", 90, 1100),
        _x("pypto_tune.step", "100.000", "1000.000"),  # older torch_npu writes strings
        _x("pypto_tune.module::model.layers.0.mlp", 150, 500),
        _x("pypto_tune.module::model.layers.0.mlp.down_proj", 195, 60),
        _x(
            "aten::linear",
            190,
            110,
            **{"Input Dims": [[1, 4096], [11008, 4096]], "Input type": ["c10::BFloat16"] * 2},
        ),
        _x("aten::mm", 200, 50),
        _x("pypto_tune.module::model.layers.0.self_attn", 700, 300),
        _x("aten::index_put_", 720, 30),
        _x("AscendCL@aclnnMm", 205, 10, pid=3000, cat="CANN"),  # not a host operator
    ]
    device = [
        _x(
            "aclnnMm_MatMulCommon_MatMulV2",
            1200.0,
            80.5,
            pid=HW,
            tid=2,
            cat="",
            **{"Task Type": "AI_CORE"},
        ),
        _x("IndexPut", 1300.123, 25, pid=HW, tid=2, cat="", **{"Task Type": "AI_CPU"}),
        _x("Cast", 400.0, 3, pid=HW, tid=2, cat="", **{"Task Type": "AI_VECTOR_CORE"}),
    ]
    return meta + host + device + _flow(1, "200.000", "1200.000") + _flow(2, 720, 1300.123)


def _csv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)


def write_profile(parent: Path, name: str = "host_4242_20261130120000000_ascend_pt", *,
                  events: Any = None, kernels: bool = True, rank: int | None = 0) -> Path:  # fmt: skip
    """A ``*_ascend_pt`` folder in torch_npu's text export layout, ``profiler_info_<rank>.json``
    beside ASCEND_PROFILER_OUTPUT as torch_npu writes it (msprof-analyze's cluster analysis
    takes the rank from its name; ``rank=None`` leaves it out)."""
    out = parent / name / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    if rank is not None:
        info = {"config": {"common_config": {
            "activities": ["ProfilerActivity.CPU", "ProfilerActivity.NPU"],
            "record_shapes": True, "profile_memory": False, "with_stack": False}},
            "rank_id": rank}  # fmt: skip
        (parent / name / f"profiler_info_{rank}.json").write_text(json.dumps(info))
    (out / "trace_view.json").write_text(json.dumps(trace_events() if events is None else events))
    if kernels:
        _csv(out / "kernel_details.csv", KERNEL_HEADER, KERNELS)
    _csv(out / "op_statistic.csv", OP_STAT_HEADER, [
        ["MatMulV2", "AI_CORE", "1", "80.5", "80.5", "80.5", "80.5", "74.6"],
        ["IndexPut", "AI_CPU", "1", "25", "25", "25", "25", "23.2"],
    ])  # fmt: skip
    step_header = ["Step", "Computing", "Communication(Not Overlapped)", "Free"]
    _csv(out / "step_trace_time.csv", step_header,
         [["0", "108.5", "0", "891.5"]])  # fmt: skip
    return parent / name


def _by_name(trace: Any, name: str, kind: str = "op") -> Any:
    return next(e for e in trace.events if e.name == name and e.kind == kind)


def test_read_modules_steps_and_kernels(tmp_path: Path) -> None:
    trace = read_ascend_output(write_profile(tmp_path))
    assert (trace.device_type, trace.backend) == ("npu", "torch_npu.profiler")
    mlp = "model.layers.0.mlp"
    assert [m.name for m in trace.modules] == [mlp, f"{mlp}.down_proj", "model.layers.0.self_attn"]
    assert [(s.name, s.start_us, s.end_us) for s in trace.steps] == [
        ("pypto_tune.step", 100.0, 1100.0)
    ]
    names = {e.name for e in trace.events}
    assert "ProfilerStep#0" not in names
    assert "AscendCL@aclnnMm" not in names
    kernels = {e.name: e for e in trace.events if e.kind == "kernel"}
    assert {k: e.core for k, e in kernels.items()} == {
        "MatMulV2": "AI_CORE", "IndexPut": "AI_CPU", "Cast": "AI_VECTOR_CORE"}  # fmt: skip
    mm = kernels["MatMulV2"]
    assert mm.shapes == [[1, 4096], [4096, 11008]]
    assert mm.dtypes == ["bf16", "bf16"]
    assert mm.device_us == 80.5
    assert mm.top is False
    assert mm.thread == -1
    assert mm.extra["kernel_name"] == "aclnnMm_MatMulCommon_MatMulV2"
    assert mm.extra["aic_mac_ratio"] == 0.85
    assert mm.extra["block_dim"] == 20
    assert mm.extra["output_shapes"] == [[1, 11008]]
    assert kernels["IndexPut"].dtypes == ["fp32", "int64", "fp32"]
    assert trace.extra["op_statistic"][1] == {
        "OP Type": "IndexPut", "Core Type": "AI_CPU", "Count": 1.0, "Total Time(us)": 25.0,
        "Min Time(us)": 25.0, "Avg Time(us)": 25.0, "Max Time(us)": 25.0,
        "Ratio(%)": 23.2}  # fmt: skip
    assert trace.extra["step_trace_time"][0]["Free"] == 891.5
    linear = _by_name(trace, "aten::linear")
    assert linear.shapes == [[1, 4096], [11008, 4096]]
    assert linear.self_us == 60.0  # 110 us minus the nested aten::mm
    assert linear.top is True
    assert _by_name(trace, "aten::mm").top is False


def test_kernel_follows_its_flow_into_the_launching_module(tmp_path: Path) -> None:
    trace = read_ascend_output(write_profile(tmp_path))
    mm_op, mm_kernel = _by_name(trace, "aten::mm"), _by_name(trace, "MatMulV2", "kernel")
    # On the device clock the matmul lies outside every module: only the flow places it,
    # in the innermost scope open when aten::mm started.
    assert not any(m.start_us <= mm_kernel.start_us < m.end_us for m in trace.modules)
    assert mm_kernel.module == "model.layers.0.mlp.down_proj"
    assert (mm_kernel.start_us, mm_kernel.dur_us, mm_kernel.thread) == (1200.0, 80.5, -1)
    assert mm_kernel.extra["linked"]
    assert mm_kernel.extra["launched_by"] == "aten::mm"
    assert mm_kernel.extra["launch_us"] == mm_op.start_us
    assert mm_op.device_us is None  # the kernel carries the device time, not twice
    assert mm_op.extra["kernel_us"] == 80.5
    index_put = _by_name(trace, "IndexPut", "kernel")
    assert index_put.module == "model.layers.0.self_attn"
    assert index_put.extra["launched_by"] == "aten::index_put_"
    # No flow: its device time falls inside the mlp scope, but that proves nothing.
    cast = _by_name(trace, "Cast", "kernel")
    assert cast.extra["linked"] is False
    assert cast.module is None
    assert (cast.start_us, cast.dur_us) == (400.0, 3.0)
    assert (trace.extra["kernels_linked"], trace.extra["kernels_unlinked"]) == (2, 1)


def test_summary_attribution_keeps_the_launching_module(tmp_path: Path) -> None:
    from pypto_tune.summary import attribute

    trace = read_ascend_output(write_profile(tmp_path))
    attribute(trace)
    assert _by_name(trace, "aten::mm").module == "model.layers.0.mlp.down_proj"
    assert _by_name(trace, "MatMulV2", "kernel").module == "model.layers.0.mlp.down_proj"
    assert _by_name(trace, "Cast", "kernel").module is None


def test_output_folder_itself_and_trace_object_form(tmp_path: Path) -> None:
    folder = write_profile(
        tmp_path, events={"traceEvents": trace_events(), "displayTimeUnit": "us"}
    )
    trace = read_ascend_output(folder / "ASCEND_PROFILER_OUTPUT")
    assert len(trace.modules) == 3
    assert trace.extra["kernel_source"] == "kernel_details.csv"


def test_without_kernel_details_kernels_come_from_the_trace(tmp_path: Path) -> None:
    trace = read_ascend_output(write_profile(tmp_path, kernels=False))
    kernels = {e.name: e for e in trace.events if e.kind == "kernel"}
    assert trace.extra["kernel_source"] == "trace_view.json"
    assert kernels["IndexPut"].core == "AI_CPU"
    assert kernels["aclnnMm_MatMulCommon_MatMulV2"].extra["launched_by"] == "aten::mm"


# ---------------------------------------------------------------- hostile folders


def _bad(folder: Path, *fragments: str, **kw: Any) -> str:
    with pytest.raises(ProfileFormatError) as info:
        read_ascend_output(folder, **kw)
    message = str(info.value)
    assert info.value.exit_code == EXIT.BAD_PROFILE
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message
    return message


def test_symlinked_file_leaving_the_folder_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "outside.json"
    secret.write_text(json.dumps(trace_events()))
    folder = write_profile(tmp_path / "p")
    target = folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    target.unlink()
    target.symlink_to(secret)
    _bad(folder, "trace_view.json", "outside the profile folder")


def test_symlinked_output_folder_leaving_is_refused(tmp_path: Path) -> None:
    elsewhere = write_profile(tmp_path / "other") / "ASCEND_PROFILER_OUTPUT"
    folder = tmp_path / "p" / "x_ascend_pt"
    folder.mkdir(parents=True)
    (folder / "ASCEND_PROFILER_OUTPUT").symlink_to(elsewhere, target_is_directory=True)
    _bad(folder, "ASCEND_PROFILER_OUTPUT", "leaving")


def test_oversize_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    folder = write_profile(tmp_path)
    big = folder / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    with big.open("r+b") as fh:  # sparse: over the real default cap, no disk used
        fh.truncate(npu.MAX_FILE_BYTES + 1)
    _bad(folder, "kernel_details.csv", "over the", "cap")


def test_fifo_is_refused_instead_of_blocking(tmp_path: Path) -> None:
    folder = write_profile(tmp_path)
    fifo = folder / "ASCEND_PROFILER_OUTPUT" / "op_statistic.csv"
    fifo.unlink()
    os.mkfifo(fifo)
    _bad(folder, "op_statistic.csv", "not a regular file")


def test_malformed_csv_row_names_file_and_line(tmp_path: Path) -> None:
    folder = write_profile(tmp_path)
    path = folder / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    path.write_text(path.read_text() + "MatMulV2,extra\n")
    _bad(folder, "kernel_details.csv", "line 5 has 2 fields")


def test_non_numeric_duration_is_refused(tmp_path: Path) -> None:
    folder = write_profile(tmp_path)
    path = folder / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    path.write_text(path.read_text().replace(",80.5,", ",eighty,", 1))
    _bad(folder, "kernel_details.csv", "line 2 Duration(us)", "not a number")


def test_csv_without_expected_columns_is_refused(tmp_path: Path) -> None:
    folder = write_profile(tmp_path)
    (folder / "ASCEND_PROFILER_OUTPUT" / "op_statistic.csv").write_text("a,b\n1,2\n")
    _bad(folder, "op_statistic.csv", "header lacks")


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ('{"foo": 1}', "not a Chrome trace"),
        ("[1, 2, 3]", "event #0 is not an object"),
        ('[{"ph": "X", "name": "aten::mm", "ts": "soon", "dur": 1}]', "not a number"),
        ('[{"ph": "X", "name": "aten::mm", "ts": NaN, "dur": 1}]', "not a number"),
        ('{"traceEvents": [', "not valid JSON"),
        ("[" * 100_000, "not valid JSON"),
    ],
)
def test_json_that_is_not_a_trace_is_refused(tmp_path: Path, payload: str, problem: str) -> None:
    folder = write_profile(tmp_path)
    (folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text(payload)
    _bad(folder, "trace_view.json", problem)


def test_missing_pieces(tmp_path: Path) -> None:
    with pytest.raises(BadInputError):
        read_ascend_output(tmp_path / "nope")
    bare = tmp_path / "x_ascend_pt"
    bare.mkdir()
    _bad(bare, "ASCEND_PROFILER_OUTPUT", "analyse")
    (bare / "ASCEND_PROFILER_OUTPUT").mkdir()
    _bad(bare, "trace_view.json", "missing")


def test_reading_never_writes_into_the_folder(tmp_path: Path) -> None:
    folder = write_profile(tmp_path)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in folder.rglob("*"))
    read_ascend_output(folder)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in folder.rglob("*")) == before


# ---------------------------------------------------------------- the session


def test_session_without_torch_npu_raises_environment_missing(tmp_path: Path) -> None:
    out = tmp_path / "prof"
    session = NpuProfilerSession(level="light", out_dir=out)
    with pytest.raises(EnvironmentMissingError) as info, session:
        pass
    assert info.value.exit_code == EXIT.ENVIRONMENT
    assert "torch_npu" in str(info.value)
    assert "\n" not in str(info.value)
    assert not out.exists()  # nothing on disk


def test_session_rejects_unknown_level(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="light, detail"):
        NpuProfilerSession(level="full", out_dir=tmp_path)


def test_session_trace_reads_the_run_it_started_not_an_older_one(tmp_path: Path) -> None:
    # An older run, touched after this session started (newest by mtime), and a link.
    old = write_profile(tmp_path, "host_1_20261130110000000_ascend_pt")
    (tmp_path / "link_ascend_pt").symlink_to(old, target_is_directory=True)
    session = NpuProfilerSession(level="detail", out_dir=tmp_path)
    assert session.snapshot() == {old.name}  # what __enter__ notes before recording
    new = write_profile(tmp_path, "host_1_20261130120000000_ascend_pt", kernels=False)
    os.utime(new, (time.time() - 120, time.time() - 120))
    os.utime(old, (time.time() + 60, time.time() + 60))
    trace = session.trace()
    assert trace.extra["folder"] == str(new.resolve())
    # Nothing new since the snapshot: the older run is not passed off as this one.
    again = NpuProfilerSession(level="light", out_dir=tmp_path)
    again.snapshot()
    with pytest.raises(ProfileFormatError, match=r"no new \*_ascend_pt folder.*only older"):
        again.trace()
    with pytest.raises(ProfileFormatError, match=r"no new \*_ascend_pt folder"):
        NpuProfilerSession(level="light", out_dir=tmp_path / "empty").trace()


def test_npu_api_table_is_the_only_way_in() -> None:
    paths = {r.path for r in NPU_API if r.kind != "kwarg"}
    assert all(r.path in paths for r in NPU_API if r.kind == "kwarg")
    assert all(r.source for r in NPU_API)
    kwargs = {
        r.kwarg for r in NPU_API if r.path == "torch_npu.profiler.profile" and r.kind == "kwarg"
    }
    assert {"activities", "record_shapes", "profile_memory", "with_stack", "experimental_config",
            "on_trace_ready"} <= kwargs  # fmt: skip
    with pytest.raises(KeyError, match="not declared"):
        npu._api("torch_npu.npu.synchronize")
    with pytest.raises(KeyError, match="not declared"):
        npu._kwargs("torch_npu.profiler.profile", with_flops=True)


@pytest.mark.npu
@pytest.mark.skipif(not npu_available(), reason="needs torch_npu and an Ascend NPU")
def test_session_records_a_real_step(tmp_path: Path) -> None:
    import torch

    a = torch.randn(64, 64, device="npu")
    rf = torch.autograd.profiler.record_function
    with (
        NpuProfilerSession(level="detail", out_dir=tmp_path) as session,
        rf("pypto_tune.step"),
        rf("pypto_tune.module::mlp"),
    ):
        (a @ a).sum().item()
    trace = session.trace()
    assert len(trace.steps) == 1
    assert [m.name for m in trace.modules] == ["mlp"]
    kernels = [e for e in trace.events if e.kind == "kernel"]
    assert kernels
    assert any(k.extra["linked"] and k.module == "mlp" for k in kernels)


# ---------------------------------------------------------------- AOE


def test_operator_tuning_config_is_aoes_tune_ops_file(tmp_path: Path) -> None:
    flagged = [
        {"name": "MatMulV2", "shapes": [[1, 4096], [4096, 11008]], "dtype": "bf16"},
        {"name": "MatMulV2", "shapes": [[1, 11008], [11008, 4096]], "dtype": "bf16"},
        {"name": "BatchMatMulV2", "shapes": [[8, 1, 128], [8, 128, 64]], "dtype": "fp16",
         "op_name": "model/layers.0/self_attn/BatchMatMulV2"},
    ]  # fmt: skip
    path = operator_tuning_config(
        flagged, tmp_path / "tune_ops_file.cfg", dump_dir="/data/aoe dump"
    )
    assert json.loads(path.read_text()) == {
        "tune_ops_type": ["MatMulV2", "BatchMatMulV2"],
        "tune_ops_name": ["model/layers.0/self_attn/BatchMatMulV2"],
    }
    readme = (tmp_path / "tune_ops_file.README.txt").read_text()
    command = f"aoe --job_type=2 --model_path='/data/aoe dump' --tune_ops_file={path.resolve()}"
    assert command in readme.splitlines()
    assert "torch_npu.npu.set_aoe('/data/aoe dump')" in readme
    assert "shapes=[[1, 4096], [4096, 11008]] dtype=bf16" in readme
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "tune_ops_file.README.txt",
        "tune_ops_file.cfg",
    ]


@pytest.mark.parametrize(
    "flagged",
    [
        [],
        [{"name": "MatMulV2; rm -rf ~"}],
        [{"name": "MatMulV2", "shapes": [["1", 2]]}],
        [{"name": "MatMulV2", "op_name": "a b\nc"}],
        ["MatMulV2"],
    ],
)
def test_operator_tuning_config_rejects_bad_items_and_writes_nothing(
    tmp_path: Path, flagged: Any
) -> None:
    with pytest.raises(BadInputError) as info:
        operator_tuning_config(flagged, tmp_path / "tune.cfg")
    assert info.value.exit_code == EXIT.USAGE
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_operator_tuning_config_needs_an_existing_folder(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="create"):
        operator_tuning_config([{"name": "MatMulV2"}], tmp_path / "missing" / "tune.cfg")


# ---------------------------------------------------------------- msprof-analyze advisor

# Stands in for Ascend's msprof-analyze, which needs CANN and cannot be installed here. It
# checks the arguments the real CLI takes (advisor all -d <*_ascend_pt> -o <dir> [-l en])
# and writes what the real one does: a PrettyTable (hrules=ALL, left-aligned) of
# No./Category/Description/Suggestion on stdout, mstt_advisor_<ts>.html under -o and
# operator_tuning_file_<ts>.cfg in its working directory.
FAKE_ADVISOR = textwrap.dedent(
    """
    import json, os, sys, time
    args = sys.argv[1:]
    MODE = {mode!r}
    if MODE == "fail":
        sys.stderr.write("Traceback ...\\nOSError: GET https://user:hf_abcdefghijklmnop@hub/x failed\\n")
        sys.exit(1)
    if MODE == "hang":
        time.sleep(30)
    assert args[:2] == ["advisor", "all"], args
    opts = dict(zip(args[2::2], args[3::2]))
    assert os.path.isdir(os.path.join(opts["-d"], "ASCEND_PROFILER_OUTPUT")), opts
    rows = [
        ["AICPU Issues", "Some operators and task duration exceed 20 us, such as : IndexPut",
         "1. Modify code to avoid aicpu operator\\n2. Cast int64 indices to int32"],
        ["Block Dim Issues", "some operator does not make full use of 24 ai core",
         "1. Optimize operator by AOE, such as:\\n'aoe --job_type=2 --model_path=$user_dump_path --tune_ops_file=operator_tuning_file.cfg'"],
    ]
    headers = ["No.", "Category", "Description", "Suggestion"]
    table = [[str(i + 1)] + r for i, r in enumerate(rows)]
    width = [max(len(l) for c in [headers[j]] + [t[j] for t in table] for l in c.split("\\n")) for j in range(4)]
    rule = "+" + "+".join("-" * (w + 2) for w in width) + "+"
    def emit(cells):
        split = [c.split("\\n") for c in cells]
        for k in range(max(len(s) for s in split)):
            print("| " + " | ".join((s[k] if k < len(s) else "").ljust(w) for s, w in zip(split, width)) + " |")
        print(rule)
    print("[INFO] Start to analyse profiling data")
    print(rule)
    emit(headers)
    for t in table:
        emit(t)
    stamp = time.strftime("%Y%m%d%H%M%S")
    open(os.path.join(opts["-o"], "mstt_advisor_" + stamp + ".html"), "w").write("<html></html>")
    json.dump({{"tune_ops_name": ["aclnnMm_MatMulCommon_MatMulV2"]}},
              open("operator_tuning_file_" + stamp + ".cfg", "w"))
    """
)


def _install_advisor(bin_dir: Path, mode: str) -> None:
    bin_dir.mkdir()
    exe = bin_dir / "msprof-analyze"
    exe.write_text(f"#!{sys.executable}\n" + FAKE_ADVISOR.format(mode=mode))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


def test_advisor_absent_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    result = run_msprof_advisor(write_profile(tmp_path))
    assert result["available"] is False
    assert "msprof-analyze" in result["reason"]


def test_advisor_findings_are_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_advisor(tmp_path / "bin", "ok")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    reports = tmp_path / "reports"
    result = run_msprof_advisor(write_profile(tmp_path), output_dir=reports)
    assert result["ok"] is True
    assert result["returncode"] == 0
    assert result["command"][1:3] == ["advisor", "all"]
    assert "-o" in result["command"]
    first, second = result["findings"]
    assert first == {
        "source": "msprof-analyze advisor",
        "title": "AICPU Issues",
        "detail": "Some operators and task duration exceed 20 us, such as : IndexPut",
        "suggestion": "1. Modify code to avoid aicpu operator\n2. Cast int64 indices to int32",
        "index": "1",
    }
    assert second["title"] == "Block Dim Issues"
    assert "aoe --job_type=2" in second["suggestion"]
    assert result["tune_ops_name"] == ["aclnnMm_MatMulCommon_MatMulV2"]
    assert {Path(p).suffix for p in result["reports"]} == {".html", ".cfg"}


def test_a_relative_output_dir_is_resolved_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The advisor runs inside the output folder: a relative -o wrote to out/out/."""
    _install_advisor(tmp_path / "bin", "ok")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.chdir(tmp_path)
    result = run_msprof_advisor(write_profile(tmp_path), output_dir="out")
    assert result["ok"] is True
    assert result["reports"]
    assert all(Path(p).parent == tmp_path / "out" for p in result["reports"])
    assert not (tmp_path / "out" / "out").exists()


def test_advisor_failure_is_reported_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_advisor(tmp_path / "bin", "fail")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    result = run_msprof_advisor(write_profile(tmp_path))
    assert result["ok"] is False
    assert result["returncode"] == 1
    assert result["findings"] == []
    assert "OSError" in result["stderr_tail"]
    assert "hf_abcdefghijklmnop" not in json.dumps(result)


def test_advisor_that_hangs_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_advisor(tmp_path / "bin", "hang")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    started = time.monotonic()
    result = run_msprof_advisor(write_profile(tmp_path), timeout_s=1)
    assert time.monotonic() - started < 20
    assert result["ok"] is False
    assert "timed out" in result["error"]


def test_advisor_parser_ignores_text_around_the_table() -> None:
    assert npu.parse_advisor_table("no problems found\n+---+\nnot a table\n") == []


def test_repeated_flow_ids_are_told_apart_by_kernel_name(tmp_path: Path) -> None:
    """Older torch_npu uses the kernel's start as the flow id: two streams, one id."""
    events = [e for e in trace_events() if e.get("cat") != "async_npu"]
    events.append(_x("aclnnIndexPut_IndexPut", 1200.0, 9, pid=HW, tid=3, cat=""))
    common = {"bp": "e", "name": "torch_to_npu", "id": 1200000, "cat": "async_npu"}
    for host_ts, stream in ((720, 3), (200, 2)):
        events.append({"ph": "s", "pid": HOST, "tid": 7, "ts": host_ts, **common})
        events.append({"ph": "f", "pid": HW, "tid": stream, "ts": 1200.0, **common})
    folder = write_profile(tmp_path, events=events)
    rows = [*KERNELS[:1], ["0", "1", "14", "3", "aclnnIndexPut_IndexPut", "IndexPut", "static",
                           "AI_CORE", "1200.0", "9"] + ["N/A"] * 13]  # fmt: skip
    _csv(folder / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", KERNEL_HEADER, rows)
    trace = read_ascend_output(folder)
    assert _by_name(trace, "MatMulV2", "kernel").extra["launched_by"] == "aten::mm"
    assert _by_name(trace, "IndexPut", "kernel").extra["launched_by"] == "aten::index_put_"
