"""Issue #10's cases against a real LocalHub: hostile listings and servers, leaked secrets,
two runs into one folder, a folder patched in place, bad flags, noisy logs."""

from __future__ import annotations

import base64
import email.utils
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dltest import (
    FILES,
    SECRET,
    base_args,
    cli,
    error_lines,
    gets,
    run_module,
    sub_env,
    tree,
)

from pypto_common import PATCH_MANIFEST
from pypto_download import (
    EXIT,
    BadInputError,
    DownloadError,
    HubServerError,
    HubTimeoutError,
    TruncatedTransferError,
    download,
    fetch,
)
from pypto_download.cli import main
from pypto_testing.hub import LocalHub

PASSWORD = "mirrorPass-7f3a9c"


@pytest.fixture
def hub():
    with LocalHub(page_size=2) as h:
        h.add_repo("org/tiny", FILES)
        yield h


def cli_any(capsys, *args: str) -> tuple[int, str, str]:
    """Like ``cli`` but also for argparse's own exits (SystemExit)."""
    try:
        code = main(list(args))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- 1. names the tools own
TOOL_OWNED = {
    ".pypto_patch.json": b'{"mode": "in-place", "files": [{"path": "README.md", "action": "replaced"}]}',
    ".pypto_patch.journal.json": b'{"op": "apply", "files": []}',
    "sub/.pypto_patch.lock": b"",
    "config.json.pypto_orig": b'{"forged": true}',
    ".cache/pypto-download/manifest.json": b'{"format": 1, "forged": true}',
    ".cache/huggingface/download/config.json.metadata": b"forged\n",
}


def test_repo_files_with_names_the_tools_own_are_skipped_and_listed(hub, tmp_path, capsys):
    hub.add_repo("org/sneaky", {**FILES, **TOOL_OWNED})
    out = tmp_path / "o"
    code, stdout, err = cli(capsys, *base_args("org/sneaky", out, hub.endpoint), "--json")
    assert code == EXIT.OK, err
    data = json.loads(stdout)
    assert {s["path"] for s in data["skipped"]} == set(TOOL_OWNED)
    assert all(s["reason"] for s in data["skipped"])
    assert tree(out) == FILES  # the model is all there, and nothing forged outside .cache
    assert set(gets(hub)) == set(FILES)  # never even requested
    for rel in (".pypto_patch.json", ".pypto_patch.journal.json", "sub", "config.json.pypto_orig"):
        assert not (out / rel).exists(), rel
    manifest = json.loads((out / ".cache/pypto-download/manifest.json").read_text())
    assert "forged" not in manifest  # ours, not the repo's
    assert b"forged" not in (out / ".cache/huggingface/download/config.json.metadata").read_bytes()
    warned = [line for line in err.splitlines() if "skipped" in line]
    assert len(warned) == len(TOOL_OWNED)
    # a re-run does not mistake the folder for a patched one (the forged manifest is not there)
    code, stdout, _ = cli(capsys, *base_args("org/sneaky", out, hub.endpoint), "--json")
    assert code == EXIT.OK
    assert json.loads(stdout)["patched"] == []


# ---------------------------------------------------------------- 2. secrets
def _assert_nothing_leaks(secrets: list[str], outputs: list[str], folder: Path) -> None:
    for secret in secrets:
        for text in outputs:
            assert secret not in text
        for p in folder.rglob("*"):
            if p.is_file():
                assert secret.encode() not in p.read_bytes(), p


def test_endpoint_credentials_and_echoed_tokens_never_leak(hub, tmp_path):
    hub.echo_auth = True  # every error answer repeats the Authorization header it got
    host = hub.endpoint.split("://", 1)[1]
    mirror = f"http://mirroruser:{PASSWORD}@{host}"
    basic = base64.b64encode(f"mirroruser:{PASSWORD}".encode()).decode()
    outputs: list[str] = []

    # a mirror with credentials: --json, the manifest and -vv logs show it masked
    r = run_module(*base_args("org/tiny", tmp_path / "a", mirror), "--json", "-vv", env=sub_env())
    assert r.returncode == EXIT.OK, r.stderr
    assert json.loads(r.stdout)["endpoint"] == f"http://***@{host}"
    outputs += [r.stdout, r.stderr]

    # the same mirror from HF_ENDPOINT, answering 503 with the Basic header echoed
    hub.fail_next(10, status=503, path_contains="/revision/")
    r = run_module(
        "--model-id", "org/tiny", "--output-dir", str(tmp_path / "b"), "--json", "-vv",
        "--retries", "1", "--backoff", "0", env=sub_env(HF_ENDPOINT=mirror),
    )  # fmt: skip
    assert r.returncode == EXIT.SERVER_ERROR
    assert f"http://***@{host}" in r.stderr
    outputs += [r.stdout, r.stderr]
    hub.clear_faults()

    # an unexpected answer whose body echoes the token; HF_TOKEN and --token alike
    for args, env in [([], {"HF_TOKEN": SECRET}), (["--token", SECRET], {})]:
        hub.fail_next(1, status=400, path_contains="/revision/")
        r = run_module(
            *base_args("org/tiny", tmp_path / "c", hub.endpoint), "--json", "-vv", *args,
            env=sub_env(**env),
        )  # fmt: skip
        assert r.returncode == EXIT.FAILED
        assert "Authorization: Bearer ***" in r.stderr  # the echo did come back, masked
        assert len(error_lines(r.stderr)) == 1
        outputs += [r.stdout, r.stderr]

    # a gated repo refusing a wrong token, echoing it
    hub.add_repo("org/gated", FILES, gated=True, token=SECRET)
    r = run_module(
        *base_args("org/gated", tmp_path / "d", hub.endpoint), "--json", "-vv",
        "--token", SECRET + "x", env=sub_env(),
    )  # fmt: skip
    assert r.returncode == EXIT.UNAUTHORIZED
    outputs += [r.stdout, r.stderr]

    # an unreachable mirror: the error names it, masked
    r = run_module(
        *base_args("org/tiny", tmp_path / "e", f"http://mirroruser:{PASSWORD}@127.0.0.1:9"),
        "--retries", "0", "--json", env=sub_env(),
    )  # fmt: skip
    assert r.returncode == EXIT.UNREACHABLE
    assert "http://***@127.0.0.1:9" in r.stderr
    outputs += [r.stdout, r.stderr]

    _assert_nothing_leaks([SECRET, PASSWORD, basic], outputs, tmp_path)


def test_library_errors_are_redacted_too(hub, tmp_path, monkeypatch):
    """pypto-e2e records str(err) of the library call: it must be clean already."""
    host = hub.endpoint.split("://", 1)[1]
    hub.fail_next(10, status=503, path_contains="/revision/")
    with pytest.raises(HubServerError) as info:
        fetch(
            "org/tiny",
            tmp_path / "o",
            endpoint=f"http://u:{PASSWORD}@{host}",
            retries=0,
            progress=False,
        )
    assert f"http://***@{host}" in str(info.value)
    assert PASSWORD not in str(info.value)
    # an unexpected answer echoing the token is a DownloadError too, masked
    hub.clear_faults()
    hub.echo_auth = True
    hub.fail_next(1, status=400, path_contains="/revision/")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    with pytest.raises(DownloadError) as unexpected:
        fetch("org/tiny", tmp_path / "o", endpoint=hub.endpoint, progress=False)
    assert unexpected.value.exit_code == EXIT.FAILED
    assert "Authorization: Bearer ***" in str(unexpected.value)
    assert SECRET not in str(unexpected.value)


# ---------------------------------------------------------------- 3. queued files cancelled
def test_a_failure_with_files_queued_reports_its_own_typed_error(hub, tmp_path, capsys):
    hub.corrupt("README.md", times=None)  # the first file in order; four more wait behind it
    code, stdout, err = cli(
        capsys,
        *base_args("org/tiny", tmp_path / "o", hub.endpoint),
        "--max-workers", "1", "--json",
    )  # fmt: skip
    assert code == EXIT.INTEGRITY
    assert "CancelledError" not in err
    lines = error_lines(err)
    assert len(lines) == 1
    assert "README.md" in lines[0]
    assert json.loads(stdout)["error"]["kind"] == "integrity"


# ---------------------------------------------------------------- 4. two runs, one folder
def test_a_second_run_into_a_busy_folder_is_refused_in_one_line(hub, tmp_path):
    out = tmp_path / "o"
    cut = 64 * 1024
    release = hub.hang_after("model.safetensors", cut)
    first = subprocess.Popen(
        [sys.executable, "-m", "pypto_download", *base_args("org/tiny", out, hub.endpoint),
         "-q", "--backoff", "0", "--max-workers", "1"],
        env=sub_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not any(
            r.file_path == "model.safetensors" and r.bytes_sent >= cut for r in hub.requests
        ):
            assert time.monotonic() < deadline, "the first run never reached the stall"
            time.sleep(0.05)
        before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
        second = run_module(*base_args("org/tiny", out, hub.endpoint), env=sub_env())
        after = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    finally:
        release.set()
    _stdout, stderr = first.communicate(timeout=120)
    assert second.returncode == EXIT.FOLDER_BUSY
    assert second.stdout == ""
    lines = second.stderr.strip().splitlines()
    assert lines == error_lines(second.stderr)  # nothing but the one error line
    assert len(lines) == 1
    assert f"another pypto-download is writing to {out} (pid {first.pid})" in lines[0]
    assert "--output-dir" in lines[0]
    assert before == after  # the refused run touched nothing
    assert first.returncode == EXIT.OK, stderr
    assert tree(out) == FILES
    # the lock goes with its holder: a third run is welcome and has nothing to fetch
    hub.clear_requests()
    third = run_module(*base_args("org/tiny", out, hub.endpoint), "-q", env=sub_env())
    assert third.returncode == EXIT.OK, third.stderr
    assert gets(hub) == []


# ---------------------------------------------------------------- 5. read timeout
def test_a_stalled_listing_times_out_and_is_retried(hub, tmp_path):
    hub.stall(5.0, path_contains="/revision/", times=None)
    t0 = time.monotonic()
    with pytest.raises(HubTimeoutError) as info:
        fetch(
            "org/tiny",
            tmp_path / "o",
            endpoint=hub.endpoint,
            read_timeout=0.3,
            retries=1,
            backoff=0,
            progress=False,
        )
    assert time.monotonic() - t0 < 4
    assert len([r for r in hub.requests if "/revision/" in r.path]) == 2
    assert "--read-timeout" in str(info.value)
    assert not (tmp_path / "o").exists()


def test_a_trickling_file_times_out_with_one_line(hub, tmp_path, capsys):
    hub.trickle("model.safetensors", nbytes=1, interval=2.0, times=None)
    t0 = time.monotonic()
    code, _, err = cli(
        capsys,
        *base_args("org/tiny", tmp_path / "o", hub.endpoint),
        "--read-timeout", "0.3", "--retries", "0",
    )  # fmt: skip
    assert code == EXIT.READ_TIMEOUT
    # huggingface_hub itself resumes a timed-out body 5 times, a second apart
    assert time.monotonic() - t0 < 20
    lines = error_lines(err)
    assert len(lines) == 1
    assert "model.safetensors" in lines[0]
    assert "--read-timeout" in lines[0]


# ---------------------------------------------------------------- 6. truncated bodies
def test_a_truncated_body_is_retried(hub, tmp_path):
    hub.truncate("model.safetensors", 1000, times=1)
    path = download("org/tiny", tmp_path / "o", endpoint=hub.endpoint, backoff=0, progress=False)
    assert tree(path) == FILES


def test_a_body_that_stays_truncated_is_named(hub, tmp_path):
    hub.truncate("model.safetensors", 1000, times=None)
    with pytest.raises(TruncatedTransferError) as info:
        fetch(
            "org/tiny", tmp_path / "o", endpoint=hub.endpoint, backoff=0, retries=2, progress=False
        )
    assert "truncated" in str(info.value)
    assert "model.safetensors" in str(info.value)
    assert (
        len([r for r in hub.requests if r.method == "GET" and r.file_path == "model.safetensors"])
        == 3
    )
    assert info.value.exit_code == EXIT.TRUNCATED


def test_a_server_closing_early_is_a_truncated_transfer_not_unreachable(hub, tmp_path, capsys):
    hub.drop_after("model.safetensors", 0, times=None)  # headers announce it all, then close
    code, _, err = cli(
        capsys, *base_args("org/tiny", tmp_path / "o", hub.endpoint), "--retries", "0"
    )
    assert code == EXIT.TRUNCATED
    assert "cannot reach" not in err
    assert len(error_lines(err)) == 1


# ---------------------------------------------------------------- 7. only true claims
def _partials(out: Path) -> list[Path]:
    return [p for p in out.rglob("*.incomplete") if p.stat().st_size > 0] if out.exists() else []


def test_after_a_failure_only_what_is_on_disk_is_claimed(hub, tmp_path):
    hub.truncate("model.safetensors", 1000, times=None)
    out = tmp_path / "o"
    with pytest.raises(TruncatedTransferError) as info:
        fetch("org/tiny", out, endpoint=hub.endpoint, backoff=0, retries=0, progress=False)
    message = str(info.value)
    downloaded = [p for p in tree(out) if p != "model.safetensors"]
    assert f"{len(downloaded)} downloaded file(s)" in message
    # huggingface_hub 2.x deletes its partial file on failure, 0.x keeps it: say which
    assert ("partial" in message) == bool(_partials(out)), message
    # nothing kept: no claim at all, and the folder we created is gone
    with pytest.raises(TruncatedTransferError) as info:
        fetch(
            "org/tiny",
            tmp_path / "new" / "o",
            endpoint=hub.endpoint,
            allow_patterns="*.safetensors",
            backoff=0,
            retries=0,
            progress=False,
        )
    if not _partials(tmp_path / "new"):
        assert "kept" not in str(info.value)
        assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------- 8. numeric flags
@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--backoff", "-5"),
        ("--backoff", "nan"),
        ("--backoff", "inf"),
        ("--retries", "-1"),
        ("--retries", "two"),
        ("--max-workers", "0"),
        ("--read-timeout", "0"),
        ("--read-timeout", "-1"),
        ("--max-retry-wait", "-1"),
    ],
)
def test_numeric_flags_are_checked_before_anything(hub, tmp_path, capsys, flag, value):
    out = tmp_path / "o"
    code, stdout, err = cli_any(capsys, *base_args("org/tiny", out, hub.endpoint), flag, value)
    assert code == EXIT.USAGE
    assert stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("pypto-download: error:")
    assert flag in lines[0]
    assert not out.exists()
    assert hub.requests == []


def test_library_checks_numbers_too(hub, tmp_path):
    for kwargs in ({"backoff": -5}, {"retries": 1.5}, {"read_timeout": float("nan")}):
        with pytest.raises(BadInputError):
            fetch("org/tiny", tmp_path / "o", endpoint=hub.endpoint, progress=False, **kwargs)
    assert hub.requests == []


# ---------------------------------------------------------------- 9. Retry-After
def _gap(hub: LocalHub, part: str) -> float:
    hits = [r for r in hub.requests if part in r.path]
    assert hits[0].status in (429, 503)
    assert hits[1].status == 200
    return hits[1].started - hits[0].started


def test_listing_honours_retry_after(hub, tmp_path):
    hub.fail_next(1, status=429, path_contains="/revision/", retry_after=1)
    hub.fail_next(1, status=503, path_contains="/tree/", retry_after=1)
    path = download("org/tiny", tmp_path / "o", endpoint=hub.endpoint, backoff=0, progress=False)
    assert tree(path) == FILES
    assert _gap(hub, "/revision/") >= 1.0
    assert _gap(hub, "/tree/") >= 1.0


def test_retry_after_is_bounded_and_may_be_a_date(hub, tmp_path):
    hub.fail_next(1, status=429, path_contains="/revision/", retry_after=3600)
    when = email.utils.formatdate(time.time() + 2, usegmt=True)
    hub.fail_next(1, status=503, path_contains="/tree/", retry_after=when)
    t0 = time.monotonic()
    download(
        "org/tiny",
        tmp_path / "o",
        endpoint=hub.endpoint,
        backoff=0,
        max_retry_wait=0.5,
        progress=False,
    )
    assert time.monotonic() - t0 < 10
    assert 0.5 <= _gap(hub, "/revision/") < 3
    assert 0.5 <= _gap(hub, "/tree/") < 3


# ---------------------------------------------------------------- 10. logs
def test_quiet_means_errors_only_and_logs_are_one_line(hub, tmp_path):
    # a cut mid-file makes the hub library warn (multi-line in 2.x) while it resumes
    hub.drop_after("model.safetensors", 100_000)
    r = run_module(
        *base_args("org/tiny", tmp_path / "q", hub.endpoint), "-q", "--backoff", "0", env=sub_env()
    )
    assert r.returncode == EXIT.OK, r.stderr
    assert r.stderr == ""
    hub.drop_after("model.safetensors", 100_000)
    r = run_module(
        *base_args("org/tiny", tmp_path / "n", hub.endpoint),
        "--json",
        "--backoff",
        "0",
        env=sub_env(),
    )  # --json: no progress bars, so stderr is logs only
    assert r.returncode == EXIT.OK, r.stderr
    lines = r.stderr.splitlines()
    assert any("WARNING" in line for line in lines), r.stderr
    assert all(line.startswith("pypto-download: ") for line in lines), r.stderr
    # an error under -q is its one line
    r = run_module(*base_args("org/missing", tmp_path / "m", hub.endpoint), "-q", env=sub_env())
    assert r.returncode == EXIT.REPO_NOT_FOUND
    assert r.stderr.splitlines() == error_lines(r.stderr)
    assert len(error_lines(r.stderr)) == 1


# ---------------------------------------------------------------- 11. hostile listings
@pytest.mark.parametrize(
    "bad",
    [
        "../evil.txt",
        "/tmp/evil.txt",
        "a/../../evil.txt",
        "sub//evil.txt",
        "a\\..\\evil.txt",
        "new\nline.txt",
    ],
)
def test_a_listing_that_escapes_the_folder_is_refused_by_name(hub, tmp_path, capsys, bad):
    hub.add_repo("org/hostile", {**FILES, bad: b"pwned"}, allow_unsafe_paths=True)
    out = tmp_path / "deep" / "o"
    code, stdout, err = cli(capsys, *base_args("org/hostile", out, hub.endpoint), "--json")
    assert code == EXIT.UNSAFE_LISTING
    lines = error_lines(err)
    assert len(lines) == 1
    assert repr(bad) in lines[0]
    assert json.loads(stdout)["error"]["kind"] == "unsafe_listing"
    assert not (tmp_path / "deep").exists()
    assert gets(hub) == []
    assert not list(tmp_path.rglob("evil.txt"))


# ---------------------------------------------------------------- 12. patched in place
def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _patch_in_place(out: Path) -> bytes:
    """What pypto-patch apply leaves: a pinned config.json, its backup, its manifest."""
    original = (out / "config.json").read_bytes()
    pinned = json.dumps({"model_type": "llama", "auto_map": {"AutoConfig": "pinned.Cfg"}}).encode()
    (out / "config.json.pypto_orig").write_bytes(original)
    (out / "config.json").write_bytes(pinned)
    (out / "pinned.py").write_text("class Cfg: ...\n")
    changes = [
        {"path": "pinned.py", "action": "created", "patched_sha256": _sha(b"")},
        {
            "path": "config.json",
            "action": "replaced",
            "patched_sha256": _sha(pinned),
            "original_sha256": _sha(original),
            "backup": "config.json.pypto_orig",
        },
    ]
    (out / PATCH_MANIFEST).write_text(
        json.dumps(
            {"schema_version": 1, "tool": "pypto-patch", "mode": "in-place", "files": changes}
        )
    )
    return pinned


def test_rerun_on_a_folder_patched_in_place_keeps_the_pin(hub, tmp_path, capsys):
    out = tmp_path / "o"
    download("org/tiny", out, endpoint=hub.endpoint, progress=False)
    pinned = _patch_in_place(out)
    (out / "README.md").write_bytes(b"damaged")  # the rest is still checked and repaired
    hub.clear_requests()
    code, stdout, err = cli(capsys, *base_args("org/tiny", out, hub.endpoint), "--json")
    assert code == EXIT.OK, err
    assert (out / "config.json").read_bytes() == pinned
    data = json.loads(stdout)
    assert data["patched"] == ["config.json"]
    assert {f["path"]: f["state"] for f in data["files"]}["config.json"] == "patched"
    warned = [line for line in err.splitlines() if "patched in place" in line]
    assert len(warned) == 1
    assert "pypto-patch status" in warned[0]
    assert "config.json" not in gets(hub)
    assert (out / "README.md").read_bytes() == FILES["README.md"]
    # the offline check accepts the pinned file as well
    offline = fetch("org/tiny", out, offline=True, progress=False)
    assert offline.state["config.json"] == "patched"
    assert offline.patched == ["config.json"]


def test_an_overlay_folder_is_refused(hub, tmp_path, capsys):
    out = tmp_path / "overlay"
    out.mkdir()
    (out / PATCH_MANIFEST).write_text(
        json.dumps({"mode": "overlay", "source_path": str(tmp_path / "model"), "files": []})
    )
    code, _, err = cli(capsys, *base_args("org/tiny", out, hub.endpoint))
    assert code == EXIT.OUTPUT_PATH
    assert "overlay" in error_lines(err)[0]
    assert sorted(p.name for p in out.iterdir()) == [PATCH_MANIFEST]
    assert gets(hub) == []
