"""A corrupt or hostile run manifest (issue 27 item 7) is the one line "run manifest ...
is unreadable (why): delete it", exit USAGE, and nothing on disk changes: undecodable
bytes, deep nesting, huge integers, wrong types anywhere a later step reads, a FIFO, a
folder, a device, an oversize file. Each goes through the real CLI (in-process main()
for the batch, one real subprocess for the FIFO, which used to hang the run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_e2e import EXIT, MANIFEST_NAME
from pypto_e2e.manifest import MAX_MANIFEST_BYTES, Manifest, validate_manifest

ONLY_PATCH = "download,smoke,bench"


@pytest.fixture(scope="module")
def valid_manifest(tmp_path_factory, demo_model) -> dict:
    """A manifest as a real run wrote it (patch step only)."""
    from pypto_e2e import RunConfig, run

    work = tmp_path_factory.mktemp("valid") / "work"
    run(
        RunConfig.from_flat(
            work_dir=work, model_path=str(demo_model), skip=tuple(ONLY_PATCH.split(","))
        )
    )
    doc = json.loads((work / MANIFEST_NAME).read_text())
    assert doc["steps"]["patch"]["status"] == "not-needed"
    return doc


def _edited(doc: dict, path: str, value) -> bytes:
    """``doc`` with the value at dotted ``path`` replaced (created if absent)."""
    copy = json.loads(json.dumps(doc))
    *parents, last = path.split(".")
    node = copy
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return json.dumps(copy).encode()


def _tune_outputs(**changes) -> dict:
    entry = {
        "status": "ok",
        "fingerprint": "0" * 16,
        "inputs": {},
        "outputs": {"step_us": 1.0, "recommendations": [], "files": {}},
    }
    entry["outputs"].update(changes)
    return entry


def _hostile(doc: dict) -> dict[str, bytes]:
    """Manifest contents that must each be refused, by what makes them unreadable."""
    text = json.dumps(doc)
    return {
        "undecodable bytes": b'\xff\xfe{"schema_version": 2}',
        "latin-1 inside a string": text.replace('"steps"', '"st\xe9ps"').encode("latin-1"),
        "truncated": text[: len(text) // 2].encode(),
        "nested 100000 deep": b"[" * 100_000 + b"]" * 100_000,
        "nested 900 deep in a step": (
            '{"schema_version": 2, "steps": {"patch": {"status": "ok", "inputs": {"x": '
            + "[" * 900
            + "]" * 900
            + "}}}}"
        ).encode(),
        "5000-digit schema version": b'{"schema_version": ' + b"9" * 5000 + b"}",
        "60-digit file size": _edited(
            doc,
            "file_digests./m/x",
            {"size": int("1" * 60), "mtime_ns": 1, "ino": 1, "digest": "d"},
        ),
        "NaN literal": b'{"schema_version": 2, "steps": {"patch": {"status": "ok", "seconds": NaN}}}',
        "a list, not an object": b"[]",
        "schema version as a string": _edited(doc, "schema_version", "2"),
        "schema version missing": _edited(doc, "schema_version", None),
        "steps as a list": _edited(doc, "steps", []),
        "a step as a string": _edited(doc, "steps.patch", "ok"),
        "an unknown step": _edited(doc, "steps.deploy", {"status": "ok"}),
        "an unknown status": _edited(doc, "steps.patch.status", "done"),
        "a status missing": _edited(doc, "steps.patch", {"fingerprint": "abc"}),
        "fingerprint as a number": _edited(doc, "steps.patch.fingerprint", 7),
        "inputs as a list": _edited(doc, "steps.patch.inputs", [1, 2]),
        "outputs as a list": _edited(doc, "steps.patch.outputs", ["model"]),
        "model_path as a number": _edited(doc, "steps.patch.outputs.model_path", 5),
        "model_path as an object": _edited(doc, "steps.download.outputs", {"model_path": {}}),
        "folder as a string": _edited(doc, "steps.download.outputs", {"folder": "/m"}),
        "folder digest missing": _edited(doc, "steps.download.outputs", {"folder": {"path": "/m"}}),
        "failed_arms as a string": _edited(
            doc, "steps.bench", {"status": "ok", "outputs": {"failed_arms": "eager"}}
        ),
        "report_sha256 as a list": _edited(
            doc, "steps.bench", {"status": "ok", "outputs": {"report_sha256": []}}
        ),
        "removed_auto_map entries as strings": _edited(
            doc, "steps.patch.outputs.removed_auto_map", ["config.json:auto_map"]
        ),
        "a recommendation's speedup as a string": _edited(
            doc, "steps.tune", _tune_outputs(recommendations=[{"estimated_speedup": "fast"}])
        ),
        "step_us as a boolean": _edited(doc, "steps.tune", _tune_outputs(step_us=True)),
        "tune files as numbers": _edited(doc, "steps.tune", _tune_outputs(files={"plot": 1})),
        "an error's exit code as a string": _edited(
            doc, "steps.smoke", {"status": "failed", "error": {"exit_code": "63"}}
        ),
        "a note as a number": _edited(doc, "steps.patch.note", 3),
        "file_digests as a list": _edited(doc, "file_digests", []),
        "a file digest as a string": _edited(doc, "file_digests./m/x", "sha256:0"),
        "a file digest without its inode": _edited(
            doc, "file_digests./m/x", {"size": 1, "mtime_ns": 1, "digest": "d"}
        ),
        "command_line with a number": _edited(doc, "command_line", ["pypto-e2e", 5]),
        "result as a list": _edited(doc, "result", []),
    }


def _refused(err: str, work: Path) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"pypto-e2e: error: run manifest {work / MANIFEST_NAME} is unreadable")
    assert line.endswith("delete it to start the run afresh")
    assert "Traceback" not in err


def test_every_hostile_manifest_is_one_line_and_nothing_changes(
    tmp_path, demo_model, valid_manifest, e2e_cli, tree_state
):
    hostile = _hostile(valid_manifest)
    work = tmp_path / "work"
    work.mkdir()
    results = {}
    for name, content in hostile.items():
        (work / MANIFEST_NAME).write_bytes(content)
        before = tree_state(work)
        rc, out, err = e2e_cli(
            "run", "--work-dir", str(work), "--model-path", str(demo_model), "--skip", ONLY_PATCH
        )
        results[name] = (rc, err)
        assert rc == EXIT.USAGE, (name, err)
        _refused(err, work)
        assert out == ""
        assert tree_state(work) == before, name
    # Each reason says what is wrong, in words a person can act on.
    reasons = {name: err.split("is unreadable (", 1)[1] for name, (_rc, err) in results.items()}
    assert "UTF-8" in reasons["undecodable bytes"]
    assert "deep" in reasons["nested 100000 deep"]
    assert "deep" in reasons["nested 900 deep in a step"]
    assert "5000-digit" in reasons["5000-digit schema version"]
    assert "60-digit" in reasons["60-digit file size"]
    assert (
        "steps.patch.outputs.model_path should be a path string"
        in reasons["model_path as a number"]
    )
    assert "steps.deploy" in reasons["an unknown step"]


def _special_files(work: Path) -> dict[str, object]:
    return {
        "a folder": lambda p: p.mkdir(),
        "a FIFO": lambda p: os.mkfifo(p),
        "a link to /dev/zero": lambda p: p.symlink_to("/dev/zero"),
        # sparse: over the limit by size without using the disk
        "an oversize file": lambda p: os.truncate(_touch(p), MAX_MANIFEST_BYTES + 1),
    }


def _touch(path: Path) -> Path:
    path.write_bytes(b"")
    return path


@pytest.mark.parametrize("kind", ["a folder", "a FIFO", "a link to /dev/zero", "an oversize file"])
def test_a_manifest_that_is_not_a_regular_file_is_refused_without_reading_it(
    tmp_path, demo_model, kind, e2e_cli, tree_state
):
    work = tmp_path / "work"
    work.mkdir()
    _special_files(work)[kind](work / MANIFEST_NAME)
    before = tree_state(work)
    rc, out, err = e2e_cli(
        "run", "--work-dir", str(work), "--model-path", str(demo_model), "--skip", ONLY_PATCH
    )
    assert rc == EXIT.USAGE, err
    assert out == ""
    _refused(err, work)
    assert tree_state(work) == before


def test_a_fifo_manifest_does_not_hang_the_real_cli(tmp_path, demo_model, tree_state):
    """The one real subprocess: `python -m pypto_e2e run` with a FIFO as its manifest
    used to block for ever in read_text()."""
    work = tmp_path / "work"
    work.mkdir()
    os.mkfifo(work / MANIFEST_NAME)
    before = tree_state(work)
    proc = subprocess.run(
        [sys.executable, "-m", "pypto_e2e", "run", "--work-dir", str(work), "--model-path",
         str(demo_model), "--skip", ONLY_PATCH, "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == EXIT.USAGE, proc.stderr
    _refused(proc.stderr, work)
    assert "not a regular file" in proc.stderr
    assert json.loads(proc.stdout)["error"]["name"] == "USAGE"
    assert tree_state(work) == before


def test_another_schema_version_is_started_afresh_not_refused(
    tmp_path, demo_model, valid_manifest, e2e_cli
):
    work = tmp_path / "work"
    work.mkdir()
    (work / MANIFEST_NAME).write_bytes(_edited(valid_manifest, "schema_version", 1))
    rc, _out, err = e2e_cli(
        "run", "--work-dir", str(work), "--model-path", str(demo_model), "--skip", ONLY_PATCH
    )
    assert rc == EXIT.OK, err
    assert "[patch] running" in err
    assert json.loads((work / MANIFEST_NAME).read_text())["schema_version"] == 2


def test_what_a_run_writes_the_next_one_reads(tmp_path, valid_manifest):
    """Non-finite numbers (a NaN step time) are saved as null, so the manifest a run
    writes always passes the reader's checks."""
    assert validate_manifest(valid_manifest) == valid_manifest
    path = tmp_path / MANIFEST_NAME
    manifest = Manifest(path)
    manifest.record("tune", status="ok", outputs={"step_us": float("nan")}, seconds=float("inf"))
    again = Manifest(path)
    assert again.step("tune")["outputs"]["step_us"] is None
    assert again.step("tune")["seconds"] is None
    # pypto-patch accepts repo auto_map values nested up to 200 levels; the manifest
    # quotes the removed ones a few levels down, and must read them back.
    deep: object = "modeling_x.Cls"
    for _ in range(197):
        deep = [deep]
    removed = [{"file": "config.json", "at": "auto_map", "key": "AutoModel", "value": deep}]
    again.record("patch", status="ok", outputs={"removed_auto_map": removed})
    again.record("report", status="ok", inputs={"patch": {"removed_auto_map": removed}})
    assert Manifest(path).step("patch")["outputs"]["removed_auto_map"] == removed
