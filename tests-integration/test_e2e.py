"""pypto-e2e end to end against the local hub: artefacts, resume, each step's failure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pypto_e2e import MANIFEST_NAME, BadRunInputError, RunConfig, StepFailedError, run

TINY_REPO = "pypto-test/tiny-llama"


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """The installed CLI as a user runs it (a real process, real exit code)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pypto_e2e", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


FAST = [
    "--device",
    "cpu",
    "--seq",
    "8",
    "--gen",
    "8",
    "--warmup",
    "0",
    "--iters",
    "1",
    "--dtype",
    "float32",
]


def _manifest(work: Path) -> dict:
    return json.loads((work / MANIFEST_NAME).read_text())


def _statuses(work: Path) -> dict[str, str]:
    return {name: step["status"] for name, step in _manifest(work)["steps"].items()}


def test_demo_runs_the_whole_workflow_offline(tmp_path):
    """The README's main job (shortened): its own hub, download, pin with the demo preset,
    smoke gate on the trained model, eager vs graph on CPU, every artefact written."""
    work = tmp_path / "run"
    proc = run_cli("demo", "--work-dir", str(work), "--gen", "8", "--iters", "1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == f"export PYPTO_REPORT={work / 'report' / 'report.md'}"
    assert lines[0] == f"export MODEL_PATH={work / 'patched'}"
    assert _statuses(work) == {s: "ok" for s in ("download", "patch", "smoke", "bench", "report")}
    report = json.loads((work / "report" / "bench.json").read_text())
    assert [a["name"] for a in report["arms"]] == ["eager", "graph"]
    assert all(a["ok"] for a in report["arms"])
    assert report["model"]["class"] == "PyptoDemoForCausalLM"  # the pinned class ran
    assert (work / "report" / "tokens_per_s.png").stat().st_size > 1000
    md = (work / "report" / "report.md").read_text()
    assert "smoke gate: passed" in md
    assert "decode" in md
    # the download stays as the hub served it; the pin lives in the overlay
    assert "auto_map" not in json.loads((work / "model" / "config.json").read_text())
    assert "auto_map" in json.loads((work / "patched" / "config.json").read_text())


def test_tiny_random_model_stops_at_the_smoke_gate(hub, tmp_path):
    """Random weights give degenerate text: the run stops before measuring anything."""
    work = tmp_path / "run"
    proc = run_cli(
        "run", "--model-id", TINY_REPO, "--work-dir", str(work), "--endpoint", hub.endpoint, *FAST
    )
    assert proc.returncode == 12, proc.stderr
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith("pypto-e2e: error: step 'smoke' failed:")
    assert "eager must work before anything is measured" in err
    statuses = _statuses(work)
    assert statuses["download"] == "ok"
    assert statuses["patch"] == "not-needed"  # transformers-native, said so
    assert statuses["smoke"] == "failed"
    assert "bench" not in statuses
    assert proc.stdout == ""


def test_tiny_model_bench_with_smoke_skipped_then_reused(hub, tmp_path):
    work = tmp_path / "run"
    args = [
        "run",
        "--model-id",
        TINY_REPO,
        "--work-dir",
        str(work),
        "--endpoint",
        hub.endpoint,
        "--skip",
        "smoke",
        "--arms",
        "eager",
        *FAST,
    ]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert _statuses(work) == {
        "download": "ok",
        "patch": "not-needed",
        "smoke": "skipped",
        "bench": "ok",
        "report": "ok",
    }
    hub.clear_requests()
    second = run_cli(*args)
    assert second.returncode == 0, second.stderr
    assert "[download] reused" in second.stderr
    assert "[bench] reused" in second.stderr
    assert hub.bytes_sent(method="GET") == 0  # nothing fetched again
    # a changed bench input re-runs bench and report only
    third = run_cli(*args[: -len(FAST)], *[x if x != "8" else "6" for x in FAST])
    assert third.returncode == 0, third.stderr
    assert "[download] reused" in third.stderr
    assert "[bench] ok" in third.stderr
    assert "[report] ok" in third.stderr


def test_resume_after_the_bench_step_is_killed(hub, tmp_path):
    work = tmp_path / "run"
    args = [
        "run",
        "--model-id",
        TINY_REPO,
        "--work-dir",
        str(work),
        "--endpoint",
        hub.endpoint,
        "--skip",
        "smoke",
        "--arms",
        "eager",
        "--device",
        "cpu",
        "--seq",
        "8",
        "--gen",
        "64",
        "--warmup",
        "2",
        "--iters",
        "50",
        "--dtype",
        "float32",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pypto_e2e", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=os.environ.copy(),
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        if (work / MANIFEST_NAME).exists() and _statuses(work).get("bench") == "running":
            break
        assert proc.poll() is None, proc.communicate()[1].decode()
        time.sleep(0.2)
    else:
        pytest.fail("bench step never started")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _statuses(work)["bench"] == "running"  # the manifest shows where it stopped
    resumed = run_cli(*[a if a != "50" else "1" for a in args])
    assert resumed.returncode == 0, resumed.stderr
    assert "[download] reused" in resumed.stderr
    assert "[bench] ok" in resumed.stderr
    assert _statuses(work)["bench"] == "ok"


@pytest.mark.parametrize(
    ("extra", "code", "step", "needle"),
    [
        (["--model-id", "nobody/missing"], None, "download", "not found"),
        (["--model-id", TINY_REPO, "--family", "no_such_family"], 2, "patch", "no_such_family"),
    ],
)
def test_step_failures_name_the_step(hub, tmp_path, extra, code, step, needle):
    work = tmp_path / "run"
    proc = run_cli("run", *extra, "--work-dir", str(work), "--endpoint", hub.endpoint, *FAST)
    assert proc.returncode != 0
    if code is not None:
        assert proc.returncode == code
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith(f"pypto-e2e: error: step '{step}' failed:"), err
    assert needle in err.lower()
    assert _statuses(work)[step] == "failed"


def test_bad_input_is_rejected_before_anything_runs(tmp_path):
    work = tmp_path / "run"
    proc = run_cli("run", "--model-id", TINY_REPO, "--work-dir", str(work), "--arms", "eager,warp")
    assert proc.returncode == 2
    assert "unknown arm 'warp'" in proc.stderr
    assert not work.exists()
    with pytest.raises(BadRunInputError, match="--skip download needs --model-path"):
        run(RunConfig(work_dir=work, skip=("download",)))
    with pytest.raises(BadRunInputError, match="unknown step 'dowload'"):
        run(RunConfig(work_dir=work, model_id=TINY_REPO, skip=("dowload",)))
    assert not work.exists()


def test_remote_code_without_a_preset_is_a_patch_failure(tmp_path, tiny_model_dir):
    import shutil

    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_x.X"}
    (model / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(StepFailedError, match="points at remote code") as info:
        run(RunConfig(work_dir=tmp_path / "w", model_path=str(model), skip=("download",)))
    assert info.value.exit_code == 2
    assert "--family" in str(info.value)
