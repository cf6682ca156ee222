"""pypto_common.files: the one atomic writer (planted links replaced, never followed) and
the untrusted-file readers (special files refused without blocking, sizes bounded by the
bytes read, hostile JSON refused in one line)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from pypto_common import (
    UntrustedFileError,
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
    json_depth,
    loads_bounded,
    read_regular_file,
)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_writers_replace_a_planted_symlink_and_leave_its_target(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    for name, write in (
        ("a.png", lambda p: atomic_write(p, lambda fh: fh.write(b"\x89PNG"))),
        ("b.bin", lambda p: atomic_write_bytes(p, b"\x00\x01")),
        ("c.json", lambda p: atomic_write_text(p, "{}")),
    ):
        link = tmp_path / name
        link.symlink_to(outside)
        assert write(link) == link
        assert outside.read_text() == "keep me"
        assert not link.is_symlink()
        assert link.is_file()
        assert link.stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert (tmp_path / "a.png").read_bytes() == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.bin", "c.json", "outside.txt"]


def test_a_failing_writer_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("old")

    def half(fh) -> None:
        fh.write(b"half")
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError, match="disk gone"):
        atomic_write(path, half)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    with pytest.raises(FileNotFoundError):
        atomic_write_text(tmp_path / "missing" / "x.txt", "x")


def test_read_regular_file_refuses_special_files_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "dir"
    folder.mkdir()
    done: list[str] = []

    def attempt() -> None:
        for path in (fifo, Path("/dev/zero"), folder):
            with pytest.raises(UntrustedFileError) as info:
                read_regular_file(path, 1024)
            done.append(str(info.value))

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "reading a FIFO blocked"
    assert done == ["is not a regular file", "is not a regular file", "is a folder"]


def test_read_regular_file_is_bounded_by_the_bytes_read(tmp_path: Path) -> None:
    # /proc files are regular files whose stat size is 0: only the read can bound them.
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(UntrustedFileError, match="more than the 16-byte limit"):
        read_regular_file("/proc/self/status", 16)
    assert read_regular_file("/proc/self/status", 1 << 20).startswith(b"Name:")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    with pytest.raises(UntrustedFileError, match="100 bytes, over the 99-byte limit"):
        read_regular_file(big, 99)
    assert read_regular_file(big, 100) == b"x" * 100


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[" * 900 + "]" * 900, "nests 900 levels deep"),
        ("[" * 100_000, "nests 100000 levels deep"),
        ('{"a": ' + "9" * 5000 + "}", "5000-digit integer"),
        ('{"a": -' + "9" * 41 + "}", "41-digit integer"),
        ('{"a": NaN}', "holds NaN"),
        ('{"a": -Infinity}', "holds -Infinity"),
        ('{"a": 1e999}', "beyond a float's range"),
        (b'{"a": "\xff"}', "not UTF-8"),
        ("{not json", "not valid JSON"),
        ("", "not valid JSON"),
    ],
)
def test_loads_bounded_refuses_hostile_json(text: str | bytes, words: str) -> None:
    with pytest.raises(UntrustedFileError, match=words) as info:
        loads_bounded(text)
    assert "\n" not in str(info.value)
    assert len(str(info.value)) < 200


def test_loads_bounded_reads_ordinary_json() -> None:
    doc = {"a": [1, 2.5, -3], "b": {"c": "[[[[{{{{ not nesting"}, "d": 10**39, "e": None}
    assert loads_bounded(json.dumps(doc)) == doc
    assert loads_bounded(json.dumps(doc).encode()) == doc
    assert json_depth(json.dumps(doc)) == 2
    assert json_depth('"\\"[[["') == 0
    assert loads_bounded("[" * 64 + "]" * 64, max_depth=64)


def test_loads_bounded_can_read_non_finite_numbers_as_null() -> None:
    text = '{"max": NaN, "min": -Infinity, "big": 1e999, "ok": 1.5}'
    with pytest.raises(UntrustedFileError):
        loads_bounded(text)
    assert loads_bounded(text, nonfinite_as_null=True) == {
        "max": None, "min": None, "big": None, "ok": 1.5,
    }  # fmt: skip
    with pytest.raises(UntrustedFileError, match="levels deep"):  # the other bounds still hold
        loads_bounded("[" * 300 + "]" * 300, nonfinite_as_null=True)
