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

from pypto_common import export_line
from pypto_e2e import EXIT, MANIFEST_NAME, BadRunInputError, RunConfig, StepFailedError, run
from pypto_testing import browser

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
    assert proc.returncode == EXIT.OK, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == export_line("PYPTO_REPORT", work / "report" / "report.md")
    assert lines[0] == export_line("MODEL_PATH", work / "patched")
    assert _statuses(work) == {
        **{s: "ok" for s in ("download", "patch", "smoke", "precision", "bench", "report")},
        "tune": "not-needed",
    }
    report = json.loads((work / "report" / "bench.json").read_text())
    assert [a["name"] for a in report["arms"]] == ["eager", "graph"]
    assert all(a["ok"] for a in report["arms"])
    assert report["model"]["class"] == "PyptoDemoForCausalLM"  # the pinned class ran
    assert (work / "report" / "tokens_per_s.png").stat().st_size > 1000
    md = (work / "report" / "report.md").read_text()
    assert "smoke gate: passed" in md
    assert "decode" in md
    # The numerical gate's verdict and the perplexity of the trained demo model on the
    # shipped passage, graph beside eager (issue #42)
    graph = report["arms"][1]["numerics"]
    assert graph["verdict"] == "pass", graph
    assert 1.0 < graph["perplexity"]["eager"] < 1e6
    assert graph["perplexity"]["arm"] == pytest.approx(graph["perplexity"]["eager"], rel=1e-3)
    assert "`graph` numerics pass" in md
    assert "perplexity" in md
    # the precision step: the demo's dtype against the CPU float64 reference, teacher-forced
    check = json.loads((work / "report" / "precision" / "check.json").read_text())
    assert check["ok"] is True
    assert check["reference"]["dtype"] == "float64"
    assert "`eager` numerics vs cpu float64: pass" in md
    # The run as one page beside report.md (issue #33), named on stderr; in a real
    # browser where Chromium is installed: offline, quiet, the arms table and the plot.
    page = work / "report" / "report.html"
    assert f"report page: {page}" in proc.stderr
    assert "PyptoDemoForCausalLM" in page.read_text()
    assert "Numerics: the reference device" in page.read_text()
    if browser.skip_reason() is None:
        got = browser.open_page(page, screenshot=tmp_path / "demo.png")
        assert got.console_errors == [], got.console_errors
        assert got.requests == [], got.requests
        assert 'id="arms"' in got.dom
        assert '<figure class="plot"><svg' in got.dom
        assert got.screenshot_size[0] == 1280
    # the download stays as the hub served it; the pin lives in the overlay
    assert "auto_map" not in json.loads((work / "model" / "config.json").read_text())
    assert "auto_map" in json.loads((work / "patched" / "config.json").read_text())


def test_tiny_random_model_stops_at_the_smoke_gate(hub, tmp_path):
    """Random weights give degenerate text: the run stops before measuring anything, and
    the message says how to measure throughput anyway."""
    work = tmp_path / "run"
    proc = run_cli(
        "run", "--model-id", TINY_REPO, "--work-dir", str(work), "--endpoint", hub.endpoint, *FAST
    )
    assert proc.returncode == EXIT.SMOKE_FAILED, proc.stderr
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith("pypto-e2e: error: step 'smoke' failed:")
    assert "eager must work before anything is measured" in err
    assert "--skip smoke" in err
    statuses = _statuses(work)
    assert statuses["download"] == "ok"
    assert statuses["patch"] == "not-needed"  # transformers-native, said so
    assert statuses["smoke"] == "failed"
    assert "bench" not in statuses
    assert proc.stdout == ""
    error = _manifest(work)["steps"]["smoke"]["error"]
    assert error["name"] == "SMOKE_FAILED"
    assert error["cause"]["tool"] == "pypto-bench"
    assert error["cause"]["name"] == "DEGENERATE"


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
    assert first.returncode == EXIT.OK, first.stderr
    assert _statuses(work) == {
        "download": "ok",
        "patch": "not-needed",
        "smoke": "skipped",
        "precision": "ok",
        "bench": "ok",
        "tune": "not-needed",
        "report": "ok",
    }
    hub.clear_requests()
    second = run_cli(*args)
    assert second.returncode == EXIT.OK, second.stderr
    assert "[download] reused" in second.stderr
    assert "[bench] reused" in second.stderr
    assert hub.bytes_sent(method="GET") == 0  # nothing fetched again
    # a changed bench input re-runs bench and report only
    third = run_cli(*args[: -len(FAST)], *[x if x != "8" else "6" for x in FAST])
    assert third.returncode == EXIT.OK, third.stderr
    assert "[download] reused" in third.stderr
    assert "[bench] ok" in third.stderr
    assert "[report] ok" in third.stderr
    # a bench flag e2e takes from pypto-bench reaches the bench and invalidates it alone
    fourth = run_cli(*args, "--ignore-eos", "--compile-mode", "default")
    assert fourth.returncode == EXIT.OK, fourth.stderr
    assert "[download] reused" in fourth.stderr
    assert "[patch] reused" in fourth.stderr
    assert "[bench] ok" in fourth.stderr
    config = json.loads((work / "report" / "bench.json").read_text())["config"]
    assert config["ignore_eos"] is True
    assert config["compile_mode"] == "default"


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
    assert resumed.returncode == EXIT.OK, resumed.stderr
    assert "[download] reused" in resumed.stderr
    assert "[bench] ok" in resumed.stderr
    assert _statuses(work)["bench"] == "ok"


def test_a_download_failure_is_e2e_s_code_with_the_tool_s_as_cause(hub, tmp_path):
    work = tmp_path / "run"
    proc = run_cli(
        "run",
        "--model-id",
        "nobody/missing",
        "--work-dir",
        str(work),
        "--endpoint",
        hub.endpoint,
        "--json",
        *FAST,
    )
    assert proc.returncode == EXIT.DOWNLOAD_FAILED, proc.stderr
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith("pypto-e2e: error: step 'download' failed:"), err
    assert "not found" in err.lower()
    assert _statuses(work)["download"] == "failed"
    doc = json.loads(proc.stdout)
    assert doc["error"]["name"] == "DOWNLOAD_FAILED"
    assert doc["error"]["step"] == "download"
    import pypto_download

    assert doc["error"]["cause"] == {
        "tool": "pypto-download",
        "code": pypto_download.RepoNotFoundError.exit_code,
        "name": pypto_download.EXIT.name_of(pypto_download.RepoNotFoundError.exit_code),
    }
    assert _manifest(work)["steps"]["download"]["error"]["cause"] == doc["error"]["cause"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--arms", "eager,warp"], "unknown arm 'warp'"),
        (["--family", "no_such_family"], "no_such_family"),
        (["--model-id", "bad//id"], "malformed model id"),
    ],
)
def test_bad_input_is_rejected_before_anything_runs(tmp_path, extra, needle):
    work = tmp_path / "run"
    proc = run_cli("run", "--model-id", TINY_REPO, "--work-dir", str(work), *extra)
    assert proc.returncode == EXIT.USAGE, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert needle in proc.stderr
    assert not work.exists()


def test_bad_run_configs_are_rejected_before_anything_runs(tmp_path):
    work = tmp_path / "run"
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
    with pytest.raises(StepFailedError, match="ships its own code") as info:
        run(RunConfig(work_dir=tmp_path / "w", model_path=str(model), skip=("download",)))
    assert info.value.exit_code == EXIT.REMOTE_CODE_REFUSED
    assert "--family" in str(info.value)
    assert "--trust-remote-code" in str(info.value)


def test_nproc_and_pipeline_placement_go_through_e2e(hub, tmp_path):
    """Issue #17: `pypto-e2e run --nproc 2` runs the bench step on 2 ranks (the tiny Llama's
    TP plan, gloo) and the report holds the gathered figures; `--placement pipeline`
    (a changed bench input) re-runs the bench step alone, layers split over a device map."""
    if (os.cpu_count() or 1) < 2 or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPU cores")
    work = tmp_path / "run"
    args = ["run", "--model-id", TINY_REPO, "--work-dir", str(work), "--endpoint", hub.endpoint,
            "--skip", "smoke", "--arms", "eager", "--regime", "prefill", "--nproc", "2",
            *FAST]  # fmt: skip
    first = run_cli(*args)
    assert first.returncode == EXIT.OK, first.stderr
    dist = json.loads((work / "report" / "bench.json").read_text())["distributed"]
    assert (dist["placement"], dist["backend"], len(dist["ranks"])) == ("tensor", "gloo", 2)
    assert dist["agreement"]["ok"]
    second = run_cli(*args, "--placement", "pipeline")
    assert second.returncode == EXIT.OK, second.stderr
    assert "[download] reused" in second.stderr
    assert "[bench] ok" in second.stderr
    dist = json.loads((work / "report" / "bench.json").read_text())["distributed"]
    assert dist["placement"] == "pipeline"
    assert dist["agreement"]["ok"]
