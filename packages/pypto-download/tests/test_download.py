"""pypto-download against a real local hub (pypto_testing.hub) and the real huggingface_hub."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dltest import (
    FILES,
    REPO_BYTES,
    SECRET,
    WEIGHTS,
    base_args,
    cli,
    error_lines,
    gets,
    sub_env,
    tree,
)

from pypto_download import (
    EXIT,
    BadInputError,
    DownloadError,
    HubUnreachableError,
    TruncatedTransferError,
    download,
    fetch,
)
from pypto_download.cli import main
from pypto_testing.hub import LocalHub


@pytest.fixture
def hub():
    with LocalHub(page_size=2) as h:
        h.add_repo("org/tiny", FILES)
        yield h


# ---------------------------------------------------------------- the happy path and every flag
def test_cli_downloads_and_prints_one_export_line(hub, tmp_path, capsys):
    out = tmp_path / "models" / "tiny"
    code, stdout, stderr = cli(
        capsys, "--model-id", "org/tiny", "--output-dir", str(out), "--endpoint", hub.endpoint
    )
    assert code == EXIT.OK
    assert stdout == f"export MODEL_PATH={out}\n"
    assert tree(out) == FILES
    assert "ready in" in stderr


def test_eval_in_a_shell_sets_model_path(hub, tmp_path):
    out = tmp_path / "with space" / "tiny"
    script = (
        f"eval \"$({sys.executable} -m pypto_download --model-id org/tiny --output-dir '{out}' --quiet)\"; "
        'printf "%s" "$MODEL_PATH"'
    )
    r = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=sub_env(hub), timeout=120
    )
    assert r.returncode == EXIT.OK, r.stderr
    assert r.stdout == str(out)
    assert tree(out) == FILES


def test_console_script_is_installed():
    exe = shutil.which(
        "pypto-download", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    )
    assert exe is not None
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == EXIT.OK
    assert "--allow-pattern" in r.stdout


def test_json_output_is_one_object(hub, tmp_path, capsys):
    out = tmp_path / "o"
    code, stdout, _ = cli(
        capsys,
        *base_args("org/tiny", str(out), hub.endpoint),
        "--json",
    )
    assert code == EXIT.OK
    data = json.loads(stdout)
    assert data["ok"] is True
    assert data["model_path"] == str(out)
    assert {f["path"]: f["size"] for f in data["files"]} == {k: len(v) for k, v in FILES.items()}
    assert data["commit"] == fetch("org/tiny", out, endpoint=hub.endpoint, dry_run=True).commit
    assert len(data["commit"]) == 40
    assert sorted(data["fetched"]) == sorted(FILES)


def test_dry_run_lists_sizes_and_changes_nothing(hub, tmp_path, capsys):
    out = tmp_path / "o"
    code, stdout, stderr = cli(
        capsys,
        *base_args("org/tiny", str(out), hub.endpoint),
        "--dry-run",
    )
    assert code == EXIT.OK
    assert stdout == ""
    assert "model.safetensors" in stderr
    assert "293.0 KiB" in stderr
    assert not out.exists()
    assert gets(hub) == []
    code, stdout, _ = cli(
        capsys,
        *base_args("org/tiny", str(out), hub.endpoint),
        "--dry-run",
        "--json",
    )
    data = json.loads(stdout)
    assert data["dry_run"] is True
    assert data["bytes_to_fetch"] == REPO_BYTES
    assert not out.exists()


def test_dry_run_after_download_says_nothing_to_fetch(hub, tmp_path):
    download("org/tiny", tmp_path / "o", endpoint=hub.endpoint, progress=False)
    plan = fetch("org/tiny", tmp_path / "o", endpoint=hub.endpoint, dry_run=True)
    assert plan.bytes_to_fetch == 0
    assert set(plan.state.values()) == {"complete"}


def test_allow_and_ignore_patterns(hub, tmp_path, capsys):
    out = tmp_path / "o"
    code, _, _ = cli(
        capsys, "--model-id", "org/tiny", "--output-dir", str(out), "--endpoint", hub.endpoint,
        "--allow-pattern", "*.json", "--allow-pattern", "extra/*", "--ignore-pattern", "tokenizer*",
    )  # fmt: skip
    assert code == EXIT.OK
    assert set(tree(out)) == {"config.json", "extra/notes.txt"}


def test_revision_branch_tag_and_commit(hub, tmp_path, capsys):
    old = hub.add_repo("org/tiny", {"config.json": b'{"v": 1}'}, revision="v1-branch", tags=("v1",))
    for rev in ("v1-branch", "v1", old):
        out = tmp_path / rev
        code, _, _ = cli(
            capsys,
            *base_args("org/tiny", str(out), hub.endpoint),
            "--revision",
            rev,
        )
        assert code == EXIT.OK
        assert tree(out) == {"config.json": b'{"v": 1}'}


def test_hf_endpoint_set_after_import_is_honoured(hub, tmp_path, capsys, monkeypatch):
    import huggingface_hub  # noqa: F401  (imported long before the variable is set)

    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    code, _, _ = cli(capsys, "--model-id", "org/tiny", "--output-dir", str(tmp_path / "o"))
    assert code == EXIT.OK
    assert tree(tmp_path / "o") == FILES
    assert gets(hub)  # it really came from this hub


def test_max_workers_and_bad_values(hub, tmp_path, capsys):
    code, _, _ = cli(
        capsys,
        *base_args("org/tiny", str(tmp_path / "o"), hub.endpoint),
        "--max-workers",
        "1",
    )
    assert code == EXIT.OK
    assert tree(tmp_path / "o") == FILES
    code, _, err = cli(
        capsys, "--model-id", "org/tiny", "--output-dir", str(tmp_path / "p"), "--max-workers", "0"
    )
    assert code == EXIT.USAGE
    assert "--max-workers" in err
    assert not (tmp_path / "p").exists()
    code, _, err = cli(
        capsys,
        *base_args("org/tiny", str(tmp_path / "p"), "ftp://x"),
    )
    assert code == EXIT.USAGE
    assert "http" in err


def test_quiet_prints_no_progress(hub, tmp_path, capfd):
    code = main(
        [
            *base_args("org/tiny", str(tmp_path / "o"), hub.endpoint),
            "--quiet",
        ]
    )
    out, err = capfd.readouterr()
    assert code == EXIT.OK
    assert out.startswith("export MODEL_PATH=")
    assert err == ""


def test_progress_goes_to_stderr(hub, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "pypto_download", "--model-id", "org/tiny", "--output-dir", str(tmp_path / "o")],
        capture_output=True, text=True, env=sub_env(hub), timeout=120,
    )  # fmt: skip
    assert r.returncode == EXIT.OK
    assert r.stdout.count("\n") == 1
    assert "total (5 files)" in r.stderr


# ---------------------------------------------------------------- token
def test_gated_repo_token_from_flag_and_env(hub, tmp_path, capsys, monkeypatch):
    hub.add_repo("org/gated", FILES, gated=True, token=SECRET)
    code, _, err = cli(
        capsys,
        *base_args("org/gated", str(tmp_path / "a"), hub.endpoint),
    )
    assert code == EXIT.UNAUTHORIZED
    assert "--token" in err
    assert "HF_TOKEN" in err
    assert not (tmp_path / "a").exists()
    code, _, err = cli(
        capsys,
        *base_args("org/gated", str(tmp_path / "b"), hub.endpoint),
        "--token",
        "hf_wrong",
    )
    assert code == EXIT.UNAUTHORIZED
    assert "no access" in err
    assert not (tmp_path / "b").exists()
    code, _, _ = cli(
        capsys,
        *base_args("org/gated", str(tmp_path / "c"), hub.endpoint),
        "--token",
        SECRET,
    )
    assert code == EXIT.OK
    assert tree(tmp_path / "c") == FILES
    monkeypatch.setenv("HF_TOKEN", SECRET)
    code, _, _ = cli(
        capsys,
        *base_args("org/gated", str(tmp_path / "d"), hub.endpoint),
    )
    assert code == EXIT.OK
    assert tree(tmp_path / "d") == FILES


def test_token_never_leaks(hub, tmp_path):
    hub.add_repo("org/gated", FILES, gated=True, token=SECRET)
    hub.corrupt("model.safetensors", times=None)  # an error path that goes deep
    seen = []
    for args, env in [
        (["--token", SECRET, "-v"], {}),
        (["--json", "-v"], {"HF_TOKEN": SECRET}),
        (["--token", SECRET + "x", "-v", "--json"], {}),  # a wrong token: error path
        (["--token", SECRET, "--dry-run", "-v"], {}),
    ]:
        r = subprocess.run(
            [sys.executable, "-m", "pypto_download", "--model-id", "org/gated", "--output-dir", str(tmp_path / "o"),
             "--backoff", "0", *args],
            capture_output=True, text=True, env=sub_env(hub, **env), timeout=120,
        )  # fmt: skip
        seen.append(r.returncode)
        assert SECRET not in r.stdout
        assert SECRET not in r.stderr
    assert seen == [EXIT.INTEGRITY, EXIT.INTEGRITY, EXIT.UNAUTHORIZED, EXIT.OK]
    for p in tmp_path.rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), p


# ---------------------------------------------------------------- resume
def test_rerun_fetches_nothing(hub, tmp_path):
    download("org/tiny", tmp_path / "o", endpoint=hub.endpoint, progress=False)
    hub.clear_requests()
    result = fetch("org/tiny", tmp_path / "o", endpoint=hub.endpoint, progress=False)
    assert result.fetched == []
    assert gets(hub) == []
    assert not [r for r in hub.requests if r.method == "HEAD"]


def test_dropped_connection_mid_file_is_resumed(hub, tmp_path):
    hub.drop_after("model.safetensors", 100_000)
    path = download(
        "org/tiny",
        tmp_path / "o",
        endpoint=hub.endpoint,
        backoff=0,
        progress=False,
        chunk_size=16 * 1024,
    )
    assert tree(path) == FILES
    assert hub.wait_idle()
    sent = hub.bytes_sent(file_path="model.safetensors", method="GET")
    # what was received before the cut is not sent again (16 KiB chunk granularity)
    assert len(WEIGHTS) <= sent <= len(WEIGHTS) + 16 * 1024, sent
    ranged = [r for r in hub.requests if r.file_path == "model.safetensors" and r.range]
    assert ranged
    assert ranged[0].status == 206


def test_killed_run_resumes_where_it_stopped(hub, tmp_path):
    """A real interruption: the process is SIGKILLed mid-file, then re-run."""
    out = tmp_path / "o"
    cut = 128 * 1024
    release = hub.hang_after("model.safetensors", cut)
    code = (
        "import sys; from pypto_download import download; "
        f"download('org/tiny', {str(out)!r}, endpoint={hub.endpoint!r}, progress=False, max_workers=1, chunk_size=16384)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=sub_env(), stderr=subprocess.PIPE)
    try:
        partial = out / ".cache" / "huggingface" / "download"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            sizes = (
                [p.stat().st_size for p in partial.glob("*.incomplete")] if partial.is_dir() else []
            )
            if sizes and max(sizes) >= cut:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the first run never reached the cut")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        release.set()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    first_run = {
        r.file_path
        for r in hub.requests
        if r.method == "GET" and r.file_path and r.finished and r.status == 200
    }
    first_run.discard("model.safetensors")
    hub.clear_requests()
    path = download("org/tiny", out, endpoint=hub.endpoint, progress=False)
    assert tree(path) == FILES
    again = gets(hub)
    assert not set(again) & first_run, "files completed before the kill were fetched again"
    assert hub.wait_idle()
    weights = [r for r in hub.requests if r.method == "GET" and r.file_path == "model.safetensors"]
    # huggingface_hub 0.x resumes its partial file itself; with 1.x/2.x (a per-process temp
    # file) pypto-download continues the killed run's partial with a Range request.
    assert len(weights) == 1
    assert weights[0].range == f"bytes={cut}-"
    assert weights[0].status == 206
    assert weights[0].bytes_sent == len(WEIGHTS) - cut
    assert not list((out / ".cache" / "huggingface" / "download").rglob("*.incomplete"))


# ---------------------------------------------------------------- integrity
def test_corrupted_byte_is_refetched_once(hub, tmp_path):
    hub.corrupt("model.safetensors", offset=12345, times=1)
    result = fetch("org/tiny", tmp_path / "o", endpoint=hub.endpoint, progress=False)
    assert result.refetched == ["model.safetensors"]
    assert tree(result.path) == FILES
    assert (
        len([r for r in hub.requests if r.method == "GET" and r.file_path == "model.safetensors"])
        == 2
    )


def test_corruption_that_persists_is_reported(hub, tmp_path, capsys):
    hub.corrupt("model.safetensors", offset=7, times=None)
    out = tmp_path / "o"
    code, stdout, err = cli(
        capsys,
        *base_args("org/tiny", str(out), hub.endpoint),
        "--json",
    )
    assert code == EXIT.INTEGRITY
    assert json.loads(stdout)["error"]["kind"] == "integrity"
    errors = [line for line in err.splitlines() if line.startswith("pypto-download: error:")]
    assert len(errors) == 1
    assert "model.safetensors" in errors[0]
    assert "sha256" in errors[0]
    assert not (out / "model.safetensors").exists()
    # the good files are kept for a resume, and a healthy server finishes the job
    hub.clear_faults()
    hub.clear_requests()
    assert tree(download("org/tiny", out, endpoint=hub.endpoint, progress=False)) == FILES
    assert gets(hub) == ["model.safetensors"]


def test_locally_damaged_file_is_detected_on_rerun(hub, tmp_path):
    out = download("org/tiny", tmp_path / "o", endpoint=hub.endpoint, progress=False)
    with open(out / "model.safetensors", "r+b") as fh:
        fh.seek(100)
        fh.write(b"\x00\x01")
    hub.clear_requests()
    result = fetch("org/tiny", out, endpoint=hub.endpoint, progress=False)
    assert result.refetched == ["model.safetensors"]
    assert tree(out) == FILES


# ---------------------------------------------------------------- transient errors
def test_transient_errors_are_retried(hub, tmp_path):
    hub.fail_next(2, status=503, path_contains="/api/models/")
    hub.fail_next(1, status=502, path_contains="config.json")
    path = download(
        "org/tiny", tmp_path / "o", endpoint=hub.endpoint, backoff=0.01, retries=3, progress=False
    )
    assert tree(path) == FILES
    assert [r.status for r in hub.requests if r.path.startswith("/api/models/org/tiny/revision")][
        :3
    ] == [503, 503, 200]


def test_retries_are_bounded(hub, tmp_path, capsys):
    hub.fail_next(100, status=503, path_contains="/api/models/")
    out = tmp_path / "o"
    t0 = time.monotonic()
    code, _, err = cli(
        capsys,
        *base_args("org/tiny", str(out), hub.endpoint),
        "--retries",
        "2",
        "--backoff",
        "0.01",
    )
    assert code == EXIT.SERVER_ERROR
    assert "503" in err
    assert "--retries" in err
    assert len([r for r in hub.requests if "/api/models/" in r.path]) == 3
    assert time.monotonic() - t0 < 30
    assert not out.exists()


# ---------------------------------------------------------------- failures: one line, distinct code, no folder left
@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--model-id", "not a/valid id"], EXIT.INVALID_MODEL_ID, "malformed model id"),
        (["--model-id", "a/b/c"], EXIT.INVALID_MODEL_ID, "malformed model id"),
        (["--model-id", "org/missing"], EXIT.REPO_NOT_FOUND, "not found"),
        (
            ["--model-id", "org/tiny", "--revision", "nope"],
            EXIT.REVISION_NOT_FOUND,
            "revision 'nope' not found",
        ),
        (
            ["--model-id", "org/tiny", "--allow-pattern", "*.gguf"],
            EXIT.NO_MATCHING_FILES,
            "no file",
        ),
    ],
)
def test_error_paths(hub, tmp_path, capsys, args, code, words):
    out = tmp_path / "new" / "dir"
    got, stdout, err = cli(capsys, *args, "--output-dir", str(out), "--endpoint", hub.endpoint)
    assert got == code
    assert stdout == ""
    lines = error_lines(err)
    assert len(lines) == 1
    assert words in lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "new").exists()


def test_unreachable_server_names_endpoint(tmp_path, capsys):
    hub = LocalHub().start()
    endpoint = hub.endpoint
    hub.close()
    out = tmp_path / "o"
    code, _, err = cli(
        capsys,
        *base_args("org/tiny", str(out), endpoint),
        "--retries",
        "1",
        "--backoff",
        "0",
    )
    assert code == EXIT.UNREACHABLE
    assert len(error_lines(err)) == 1
    assert endpoint in err
    assert "HF_ENDPOINT" in err
    assert not out.exists()


def test_server_going_down_mid_download(hub, tmp_path):
    release = hub.hang_after("model.safetensors", 50_000)
    out = tmp_path / "pre"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    import threading

    def kill_soon():
        time.sleep(0.5)
        hub.stop()
        release.set()

    threading.Thread(target=kill_soon, daemon=True).start()
    # huggingface_hub 2.x retries the cut body itself and finds the server gone; 0.x
    # reports the cut: a truncated body (a retry here would cost 2.x 20 s of backoff).
    with pytest.raises((HubUnreachableError, TruncatedTransferError)) as info:
        download(
            "org/tiny",
            out,
            endpoint=hub.endpoint,
            retries=0,
            progress=False,
            allow_patterns="*.safetensors",
        )
    assert (out / "mine.txt").read_text() == "keep me"  # a folder that existed keeps its content
    cache = out / ".cache"
    kept = [p for p in cache.rglob("*.incomplete") if p.stat().st_size] if cache.exists() else []
    assert ("re-run" in str(info.value)) == bool(kept)
    if not kept:  # nothing worth resuming: the .cache we created is gone too
        assert not cache.exists()


def test_output_path_is_a_file(hub, tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    code, _, err = cli(
        capsys, "--model-id", "org/tiny", "--output-dir", str(f), "--endpoint", hub.endpoint
    )
    assert code == EXIT.OUTPUT_PATH
    assert "not a folder" in err
    code, _, err = cli(
        capsys, "--model-id", "org/tiny", "--output-dir", str(f / "sub"), "--endpoint", hub.endpoint
    )
    assert code == EXIT.OUTPUT_PATH
    assert f.read_text() == "x"
    assert gets(hub) == []


@contextlib.contextmanager
def _mount_tmpfs(where: Path, options: str):
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or 'not root'})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_output_not_writable(hub, tmp_path, capsys):
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = ro / "o"
        code, _, err = cli(
            capsys,
            *base_args("org/tiny", str(target), hub.endpoint),
        )
        ro.chmod(0o700)
    else:  # root ignores permissions: a read-only mount is the honest test
        with _mount_tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
            target = ro / "o"
            code, _, err = cli(
                capsys,
                *base_args("org/tiny", str(target), hub.endpoint),
            )
    assert code == EXIT.OUTPUT_PATH
    assert "not writable" in err
    assert "--output-dir" in err


def test_disk_full_on_a_tiny_tmpfs(hub, tmp_path, capsys):
    with _mount_tmpfs(tmp_path / "small", "size=128k") as small:
        out = small / "o"
        code, _, err = cli(
            capsys,
            *base_args("org/tiny", str(out), hub.endpoint),
            "--backoff",
            "0",
        )
        assert code == EXIT.DISK_FULL, err
        assert len(error_lines(err)) == 1
        assert "no space left" in err


# ---------------------------------------------------------------- offline
def test_offline_rerun_uses_the_folder(hub, tmp_path):
    out = tmp_path / "o"
    download("org/tiny", out, endpoint=hub.endpoint, progress=False)
    hub.stop()  # nothing to talk to, and HF_HUB_OFFLINE says not to try
    cmd = [
        sys.executable,
        "-m",
        "pypto_download",
        "--model-id",
        "org/tiny",
        "--output-dir",
        str(out),
        "--json",
    ]
    r = subprocess.run(
        cmd, capture_output=True, text=True, env=sub_env(HF_HUB_OFFLINE="1"), timeout=120
    )
    assert r.returncode == EXIT.OK, r.stderr
    data = json.loads(r.stdout)
    assert data["offline"] is True
    assert data["model_path"] == str(out)
    # a damaged folder is not served offline
    (out / "config.json").write_text("{}")
    r = subprocess.run(
        cmd, capture_output=True, text=True, env=sub_env(HF_HUB_OFFLINE="1"), timeout=120
    )
    assert r.returncode == EXIT.OFFLINE_INCOMPLETE
    assert "config.json" in r.stderr
    r = subprocess.run(
        [*cmd[:-2], str(tmp_path / "never"), "--json"],
        capture_output=True,
        text=True,
        env=sub_env(HF_HUB_OFFLINE="1"),
        timeout=120,
    )
    assert r.returncode == EXIT.OFFLINE_INCOMPLETE
    assert "HF_HUB_OFFLINE" in r.stderr
    assert not (tmp_path / "never").exists()


def test_library_error_types_and_codes_are_distinct():
    import pypto_download.errors as errors

    classes = [
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, DownloadError) and obj is not DownloadError
    ]
    own = [c.exit_code for c in classes if c is not BadInputError]
    assert len(own) == len(set(own))  # one cause, one code
    assert all(code in EXIT.range for code in own)
    assert all(c.exit_code in EXIT for c in [*classes, DownloadError])
    assert BadInputError.exit_code == EXIT.USAGE
    assert DownloadError.exit_code == EXIT.FAILED
    assert {e.name for e in EXIT} >= {"OK", "FAILED", "USAGE", "ENVIRONMENT", "READ_TIMEOUT"}
    import pypto_download

    assert pypto_download.EXIT is EXIT
