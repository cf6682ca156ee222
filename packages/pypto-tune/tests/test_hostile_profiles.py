"""Hostile profile.json files through the real CLI (advise, advise --write, compare): each
is BAD_PROFILE (80) in one line and the file is left as it was; none is an "unexpected"
exit 1. Most run ``main()`` in-process; the ones that could hang or exhaust the stack run
as real processes. Also: write failures name the path (WRITE_FAILED, 84) and compare's
refusals (different device or dtype: NOT_COMPARABLE; non-finite flags: USAGE)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from constructed import make_profile, matmul_op

from pypto_tune import EXIT, Profile, advise, write_profile
from pypto_tune.cli import main
from pypto_tune.schema import PROFILE_SCHEMA, Spec


def _base() -> Profile:
    prof = make_profile(
        [matmul_op(33, 17, 31, batch=512, us=500.0), matmul_op(8, 8, 8, us=100.0)],
        kernel_plugins=[{"name": "demo", "tunables": {"rms_norm": ["rows", "hidden"]}}],
        model_shapes={"rows": 8, "hidden": 64},
        command_line=["pypto-tune", "profile"],
    )
    prof.peaks["replay"] = {"us": 5.0}
    prof.microbench["kv_layout"] = {"head_major_speedup": 1.5}
    prof.warnings.append("a warning")
    return advise(prof)


@pytest.fixture(scope="module")
def base_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_profile(_base(), tmp_path_factory.mktemp("base") / "base.json")


def _err_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    err = capsys.readouterr().err
    return [ln for ln in err.splitlines() if ln.startswith("pypto-tune: error:")]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 80) -> str:
    capsys.readouterr()
    got = main(argv)
    lines = _err_lines(capsys)
    assert got == code, (argv, lines)
    assert len(lines) == 1, lines
    return lines[0]


# ------------------------------------------------------------ every field, every wrong type


def _spec_at(path: tuple[Any, ...]) -> Spec | None:
    spec: Spec | None = PROFILE_SCHEMA
    for key in path:
        if spec is None:
            return None
        if spec.kind == "obj":
            spec = spec.keys.get(key)
        elif spec.kind in ("list", "dict"):
            spec = spec.item
        else:
            return None
    return spec


def _wrong(value: Any) -> list[Any]:
    """Two values of another JSON type than ``value``."""
    if isinstance(value, bool):
        return ["x", [1]]
    if isinstance(value, (int, float)):
        return ["5", [1]]
    if isinstance(value, str):
        return [5, [1]]
    if isinstance(value, list):
        return ["x", {"a": 1}]
    if isinstance(value, dict):
        return ["x", [1]]
    return [[1], {"a": 1}]  # null


def _paths(data: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every node's path, not descending where the schema leaves a field free."""
    if path:
        yield path
    spec = _spec_at(path) if path else PROFILE_SCHEMA
    if spec is None or spec.kind == "any":
        return
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, (*path, k))
    elif isinstance(data, list):
        for i, v in enumerate(data[:2]):
            yield from _paths(v, (*path, i))


def _mutations() -> list[tuple[str, Any, bool]]:
    """(name, document, whether the schema must refuse it)."""
    data = json.loads(json.dumps(_base().to_dict()))
    out = []
    for path in _paths(data):
        spec = _spec_at(path)
        for wrong in _wrong(_get(data, path)):
            doc = json.loads(json.dumps(data))
            _put(doc, path, wrong)
            declared = spec is not None and spec.kind != "any"
            out.append((".".join(map(str, path)) + f"={json.dumps(wrong)}", doc, declared))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _put(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    _get(doc, path[:-1])[path[-1]] = value


def test_every_wrong_type_is_bad_profile_never_unexpected(
    tmp_path: Path, base_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = _mutations()
    assert len(cases) > 150
    refused = 0
    for i, (name, doc, declared) in enumerate(cases):
        path = tmp_path / f"m{i}.json"
        path.write_text(json.dumps(doc))
        before = path.read_bytes()
        for argv in (
            ["advise", str(path), "--write"],
            ["compare", str(base_file), str(path), "--json"],
            ["compare", str(path), str(base_file)],
        ):
            capsys.readouterr()
            code = main(argv)
            lines = _err_lines(capsys)
            assert code in (EXIT.OK, EXIT.BAD_PROFILE, EXIT.NOT_COMPARABLE), (name, argv, lines)
            if declared:
                assert code == EXIT.BAD_PROFILE, (name, argv)
            if code != EXIT.OK:
                assert len(lines) == 1, (name, lines)
                assert path.read_bytes() == before, name  # refused: nothing written
        refused += declared
    assert refused > 100  # the schema covers the fields the readers use


# ------------------------------------------------------------------ named hostile files

HEADER = '{"schema": "pypto-tune.profile", "schema_version": "1.0", '
NAMED = {
    "blocks of numbers": HEADER + '"blocks": {"mlp": 5}}',
    "an op without its fields": HEADER + '"ops": [{"name": "aten::mm"}]}',
    "an op name that is a number": HEADER
    + '"ops": [{"name": 1, "module": null, "block": "mlp", "layer": null, "calls": 1, '
    '"host_us": 1, "self_us": 1, "device_us": 1}]}',
    "meta.model a string": HEADER + '"meta": {"model": "llama"}}',
    "meta.kernel_plugins without name": HEADER + '"meta": {"kernel_plugins": [{}]}}',
    "peaks as text": HEADER + '"peaks": {"matmul_flops_per_s": "fast"}}',
    "counters.warmup a number": HEADER + '"counters": {"warmup": 5}}',
    "a 5000-digit integer": HEADER + '"step": {"count": ' + "9" * 5000 + "}}",
    "a 1e999 float": HEADER + '"step": {"host_gap_us": 1e999}}',
    "NaN": HEADER + '"step": {"host_gap_us": NaN}}',
    "900-deep nesting": HEADER + '"meta": {"x": ' + "[" * 900 + "]" * 900 + "}}",
    "undecodable bytes": HEADER + '"meta": {"x": "\udcff"}}',
    "a JSON list": "[1, 2]",
    "empty": "",
}


def test_named_hostile_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, text in NAMED.items():
        path = tmp_path / "p.json"
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        for argv in (["advise", str(path), "--write"], ["compare", str(path), str(path)]):
            line = _refused(argv, capsys)
            assert str(path) in line, (name, line)
        assert path.read_bytes() == text.encode("utf-8", "surrogateescape"), name


def test_special_files_are_refused_without_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    for path, words in (
        (Path("/dev/zero"), "not a regular file"),
        (link, "not a regular file"),
        (folder, "a folder"),
        (loop, "cannot be read"),
    ):
        assert words in _refused(["advise", str(path)], capsys), path


def _cli(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pypto_tune", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_fifo_and_deep_nesting_as_real_processes(tmp_path: Path) -> None:
    """A FIFO nobody writes to would block a plain open(); 900-deep nesting passed the
    parser and crashed the writer of ``advise --write`` (RecursionError)."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text(NAMED["900-deep nesting"])
    before = deep.read_bytes()
    for argv in (["advise", str(fifo)], ["advise", str(deep), "--write"]):
        proc = _cli(*argv)
        assert proc.returncode == EXIT.BAD_PROFILE, proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("pypto-tune: error")]
        assert len(lines) == 1, proc.stderr
        assert "Traceback" not in proc.stderr
    assert deep.read_bytes() == before


# ------------------------------------------------------------------ compare's refusals


def test_compare_refuses_other_devices_dtypes_and_non_finite_flags(
    tmp_path: Path, base_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in (("device_type", "cuda"), ("dtype", "bfloat16")):
        other = _base()
        other.meta[key] = value
        path = write_profile(other, tmp_path / f"{key}.json")
        line = _refused(["compare", str(base_file), str(path)], capsys, EXIT.NOT_COMPARABLE)
        assert value in line
    for tol in ("nan", "inf", "-inf", "0.5"):
        line = _refused(
            ["compare", str(base_file), str(base_file), f"--tolerance={tol}"], capsys, EXIT.USAGE
        )
        assert "--tolerance" in line
    for value in ("nan", "-1", "inf", "-inf"):
        flag = f"host_gap_share={value}"
        line = _refused(["advise", str(base_file), "--threshold", flag], capsys, EXIT.USAGE)
        assert "host_gap_share" in line
        assert "finite number >= 0" in line
    assert main(["advise", str(base_file), "--threshold", "graph_breaks=0", "-q"]) == EXIT.OK


# ------------------------------------------------------------------ outputs that cannot be written


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Any]:
    """Mount a small tmpfs (root with CAP_SYS_ADMIN; skipped elsewhere)."""
    mounted: list[Path] = []

    def make(name: str, size: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
        mounted.append(where)
        return where

    yield make
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


def _remount_ro(where: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)


def test_advise_write_on_a_read_only_file_system_names_the_path(
    mount: Any, base_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ro = mount("ro", "1m")
    path = ro / "profile.json"
    path.write_bytes(base_file.read_bytes())
    _remount_ro(ro)
    line = _refused(["advise", str(path), "--write"], capsys, EXIT.WRITE_FAILED)
    assert str(path) in line
    assert "Read-only file system" in line
    assert "without --write" in line
    assert path.read_bytes() == base_file.read_bytes()
    assert main(["advise", str(path), "-q"]) == EXIT.OK  # reading it is fine


def test_profile_out_on_a_full_disk_names_the_path(
    mount: Any, tiny_llama: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = mount("full", "16k")
    out = full / "prof"
    argv = ["profile", "--model-path", str(tiny_llama), "--device", "cpu", "--seq", "4",
            "--gen", "2", "--iters", "1", "--warmup", "0", "--no-peaks", "--out", str(out),
            "-q"]  # fmt: skip
    line = _refused(argv, capsys, EXIT.WRITE_FAILED)
    assert str(out / "profile.json") in line
    assert "No space left on device" in line
    assert not any(p.name.endswith(".tmp") for p in out.iterdir())  # no temp file left


def test_a_write_the_os_refuses_names_the_path_anywhere(tmp_path: Path, base_file: Path) -> None:
    """Where no tmpfs can be mounted: a real process whose file-size limit (RLIMIT_FSIZE,
    which binds root too) makes the kernel refuse the write; same one line, same code."""
    path = tmp_path / "profile.json"
    path.write_bytes(base_file.read_bytes())
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))\n"
        "from pypto_tune.cli import main\n"
        "raise SystemExit(main(sys.argv[1:]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "advise", str(path), "--write", "-q"],
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == EXIT.WRITE_FAILED, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("pypto-tune: error")]
    assert len(lines) == 1, proc.stderr
    assert str(path) in lines[0]
    assert "File too large" in lines[0]
    assert path.read_bytes() == base_file.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]  # no temp file left
