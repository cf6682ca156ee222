"""pypto-download and pypto-patch on one folder: a re-download never silently undoes a pin,
and a repo cannot plant pypto-patch's bookkeeping through a download."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pypto_download import fetch
from pypto_patch import EXIT as PATCH_EXIT
from pypto_patch import apply, status, verify_pinned
from pypto_testing.hub import LocalHub

REPO = "pypto-test/tiny-llama-pin"


def _download_cli(hub: LocalHub, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pypto_download", "--model-id", REPO, "--output-dir", str(out)],
        capture_output=True,
        text=True,
        env={"HF_ENDPOINT": hub.endpoint, "PATH": "/usr/bin:/bin", "HOME": str(out.parent)},
        timeout=300,
    )


def test_redownload_keeps_an_in_place_pin_and_says_so(tmp_path, tiny_model_dir):
    out = tmp_path / "model"
    with LocalHub() as hub:
        hub.add_repo(REPO, tiny_model_dir)
        fetch(REPO, out, endpoint=hub.endpoint, progress=False)
        apply(out, family="pypto_demo")
        pinned_config = (out / "config.json").read_bytes()
        assert json.loads(pinned_config)["auto_map"]["AutoConfig"].startswith("configuration_")

        proc = _download_cli(hub, out)

    assert proc.returncode == 0, proc.stderr
    assert "pypto-patch status" in proc.stderr
    assert (out / "config.json").read_bytes() == pinned_config
    assert status(out).patched
    verify_pinned(out)  # still a valid pin: every auto_map entry resolves to placed code


def test_a_repo_cannot_plant_patch_bookkeeping_through_a_download(tmp_path, tiny_model_dir):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    forged = {
        "schema": 1,
        "files": [{"path": str(victim), "backup": "config.json.pypto_orig"}],
    }
    repo_files = {p.name: p.read_bytes() for p in tiny_model_dir.iterdir() if p.is_file()}
    repo_files[".pypto_patch.journal.json"] = json.dumps(forged).encode()
    repo_files[".pypto_patch.json"] = json.dumps(forged).encode()
    out = tmp_path / "model"
    with LocalHub() as hub:
        hub.add_repo(REPO, repo_files)
        result = fetch(REPO, out, endpoint=hub.endpoint, progress=False)
    assert not (out / ".pypto_patch.journal.json").exists()
    assert not (out / ".pypto_patch.json").exists()
    assert {s.path for s in result.skipped} >= {
        ".pypto_patch.journal.json",
        ".pypto_patch.json",
    }
    # And even if such a file arrives by another road, pypto-patch refuses it untouched.
    (out / ".pypto_patch.journal.json").write_text(json.dumps(forged))
    proc = subprocess.run(
        [sys.executable, "-m", "pypto_patch", "restore", "--model-path", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == PATCH_EXIT.UNSAFE_BOOKKEEPING, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert victim.read_text() == "keep me"
