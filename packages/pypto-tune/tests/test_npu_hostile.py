"""Hostile torch_npu.profiler folders (the documented ``*_ascend_pt/ASCEND_PROFILER_OUTPUT``
layout, each with one thing wrong): every one is the documented error (``BAD_PROFILE``,
or ``USAGE`` for a path that is not a folder) in one line, never a raw TypeError,
ValueError, IsADirectoryError or RuntimeError, and reading never hangs."""

from __future__ import annotations

import csv
import io
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from test_npu import trace_events, write_profile

from pypto_tune import EXIT, TuneError
from pypto_tune.npu import read_ascend_output

OUT = "ASCEND_PROFILER_OUTPUT"


def _events(folder: Path, edit: Callable[[list[dict]], object]) -> None:
    events = trace_events()
    edit(events)
    (folder / OUT / "trace_view.json").write_text(json.dumps(events))


def _first(events: list[dict], name: str) -> dict:
    return next(e for e in events if e.get("name") == name)


def _set(name: str, key: str, value: object) -> Callable[[Path], None]:
    return lambda f: _events(f, lambda ev: _first(ev, name).__setitem__(key, value))


def _raw(file: str, text: bytes) -> Callable[[Path], None]:
    return lambda f: (f / OUT / file).write_bytes(text)


def _replace(file: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    def run(folder: Path) -> None:
        path = folder / OUT / file
        path.unlink()
        make(path)

    return run


def _kernel_cell(column: str, value: str) -> Callable[[Path], None]:
    def run(folder: Path) -> None:
        path = folder / OUT / "kernel_details.csv"
        rows = list(csv.reader(io.StringIO(path.read_text())))
        rows[1][rows[0].index(column)] = value
        with path.open("w", newline="") as fh:
            csv.writer(fh).writerows(rows)

    return run


def _loop_output(folder: Path) -> None:
    (folder / OUT).rename(folder / "moved")
    (folder / OUT).symlink_to(folder / OUT)


def _output_is_a_file(folder: Path) -> None:
    for p in (folder / OUT).iterdir():
        p.unlink()
    (folder / OUT).rmdir()
    (folder / OUT).write_text("not a folder")


def _dev_zero(path: Path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's device numbers


def _deep(folder: Path) -> None:
    _events(folder, lambda ev: _first(ev, "aten::mm")["args"].__setitem__("x", 0))
    path = folder / OUT / "trace_view.json"
    path.write_text(path.read_text().replace('"x": 0', '"x": ' + "[" * 900 + "]" * 900))


HOSTILE: dict[str, Callable[[Path], None]] = {
    "trace_view.json is a folder": _replace("trace_view.json", lambda p: p.mkdir()),
    "trace_view.json is a symlink loop": _replace("trace_view.json", lambda p: p.symlink_to(p)),
    "trace_view.json is a FIFO": _replace("trace_view.json", lambda p: os.mkfifo(p)),
    "kernel_details.csv is /dev/zero": _replace("kernel_details.csv", _dev_zero),
    "op_statistic.csv links to /dev/zero": _replace(
        "op_statistic.csv", lambda p: p.symlink_to("/dev/zero")
    ),
    "ASCEND_PROFILER_OUTPUT is a symlink loop": _loop_output,
    "ASCEND_PROFILER_OUTPUT is a file": _output_is_a_file,
    "a pid that is a list": _set("aten::mm", "pid", [1, 2]),
    "a process pid that is an object": lambda f: _events(
        f, lambda ev: ev[0].__setitem__("pid", {"a": 1})
    ),
    "a tid that is an object": _set("aten::mm", "tid", {"t": 1}),
    "a flow id that is a list": lambda f: _events(
        f, lambda ev: [e.__setitem__("id", [1]) for e in ev if e.get("cat") == "async_npu"]
    ),
    "a flow without a ts": lambda f: _events(
        f, lambda ev: next(e for e in ev if e.get("cat") == "async_npu").pop("ts")
    ),
    "an event name that is a number": _set("aten::mm", "name", 5),
    "a dur that is a list": _set("aten::mm", "dur", [1]),
    "a ts of 5000 digits": lambda f: (f / OUT / "trace_view.json").write_text(
        '[{"ph": "X", "name": "aten::mm", "ts": ' + "9" * 5000 + ', "dur": 1}]'
    ),
    "a ts of 1e999": _raw("trace_view.json", b'[{"ph": "X", "name": "a", "ts": 1e999, "dur": 1}]'),
    "a ts of Infinity": _raw(
        "trace_view.json", b'[{"ph": "X", "name": "a", "ts": Infinity, "dur": 1}]'
    ),
    "900-deep nesting in args": _deep,
    "undecodable bytes in trace_view.json": _raw("trace_view.json", b'[{"name": "\xff\xfe"}]'),
    "an empty trace_view.json": _raw("trace_view.json", b""),
    "traceEvents that is an object": _raw("trace_view.json", b'{"traceEvents": {"a": 1}}'),
    "undecodable bytes in kernel_details.csv": _raw("kernel_details.csv", b"Name,\xff\n"),
    "a 5000-digit duration": _kernel_cell("Duration(us)", "9" * 5000),
    "a csv field over the csv module's limit": _kernel_cell("Name", "x" * 200_000),
    "a csv row with too many fields": lambda f: (f / OUT / "op_statistic.csv").write_text(
        "OP Type,Count\nMatMul,1,2\n"
    ),
    "a non-numeric kernel start": _kernel_cell("Start Time(us)", "soon"),
    "a NaN kernel duration": _kernel_cell("Duration(us)", "nan"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_profiler_folder_is_the_documented_one_line_error(
    tmp_path: Path, case: str
) -> None:
    folder = write_profile(tmp_path)
    HOSTILE[case](folder)
    with pytest.raises(TuneError) as info:  # the documented, typed errors only
        read_ascend_output(folder)
    assert info.value.exit_code in (EXIT.BAD_PROFILE, EXIT.USAGE), info.value
    assert "\n" not in str(info.value)
    assert len(str(info.value)) < 400


#: Odd but readable: read without a crash (these raised ValueError before).
ODD: dict[str, Callable[[Path], None]] = {
    "a tid of non-ASCII digits": _set("aten::mm", "tid", "\u00b2"),
    "a NUL byte in a csv": _raw("op_statistic.csv", b"OP Type,Count\n\x00,1\n"),
    "a 19-digit shape dimension": _kernel_cell("Input Shapes", "1," + "9" * 19),
    "a 5000-digit shape dimension": _kernel_cell("Input Shapes", "1," + "9" * 5000),
}


@pytest.mark.parametrize("case", sorted(ODD))
def test_odd_but_readable_folder_is_read(tmp_path: Path, case: str) -> None:
    folder = write_profile(tmp_path)
    ODD[case](folder)
    trace = read_ascend_output(folder)
    assert any(e.kind == "kernel" for e in trace.events)


def test_the_folder_itself_as_a_symlink_loop_is_bad_input(tmp_path: Path) -> None:
    loop = tmp_path / "x_ascend_pt"
    loop.symlink_to(loop)
    with pytest.raises(TuneError) as info:
        read_ascend_output(loop)
    assert info.value.exit_code == EXIT.USAGE
