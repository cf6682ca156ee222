"""`pypto-e2e run --tune`: the tune step (pypto-tune's profile + advice after the bench),
its reuse, its validation, its failure, its optional install, and the report's links.

One real run (the embedded demo model on CPU, gen 8, one profiled iteration) is shared
by the module; each test that changes it works on its own copy of the work dir.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_e2e import EXIT, MANIFEST_NAME, BadRunInputError, RunConfig, run
from pypto_e2e.cli import main
from pypto_e2e.demo import demo_model_dir
from pypto_e2e.report import _code, tuning_section

pytest.importorskip("pypto_tune")
pytest.importorskip("transformers")

# Small on purpose: the point is the step's plumbing, not the numbers.
BENCH_FLAGS = [
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--regime",
    "decode",
    "--arms",
    "eager",
    "--seq",
    "8",
    "--gen",
    "8",
    "--iters",
    "1",
    "--warmup",
    "0",
    "--no-bandwidth",
]


def _cli(work: Path, model: Path, *extra: str) -> tuple[int, str, str]:
    argv = [
        "run",
        "--work-dir",
        str(work),
        "--model-path",
        str(model),
        "--skip",
        "download,smoke",
        *BENCH_FLAGS,
        *extra,
    ]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _steps(work: Path) -> dict[str, dict]:
    return json.loads((work / MANIFEST_NAME).read_text())["steps"]


def _statuses(work: Path) -> dict[str, str]:
    return {k: v["status"] for k, v in _steps(work).items()}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("tune-model") / "model"
    shutil.copytree(demo_model_dir(), dest)
    return dest


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, model: Path) -> dict:
    """One `run --tune --json`: its work dir, exit code, JSON output and stderr; a
    pristine copy of the work dir is kept for :func:`_fresh`."""
    base = tmp_path_factory.mktemp("tuned")
    work = base / "work"
    rc, out, err = _cli(work, model, "--tune", "--tune-iters", "1", "--json")
    shutil.copytree(work, base / "pristine")
    return {"work": work, "rc": rc, "doc": json.loads(out) if out.strip() else None, "err": err}


def _fresh(tuned: dict) -> Path:
    """The shared run's work dir as the first run left it, at the same path (the
    manifest's fingerprints cover paths inside it, so a copy elsewhere re-runs steps)."""
    assert tuned["rc"] == EXIT.OK, tuned["err"]
    work: Path = tuned["work"]
    shutil.rmtree(work)
    shutil.copytree(work.parent / "pristine", work)
    return work


def test_tune_writes_the_profile_and_the_report_links_it(tuned):
    work = _fresh(tuned)
    tune_dir = work / "report" / "tune"
    for name in ("profile.json", "profile.md", "report.html", "trace.json", "breakdown.png"):
        assert (tune_dir / name).is_file(), name
    assert json.loads((tune_dir / "profile.json").read_text())["schema_version"]
    trace = json.loads((tune_dir / "trace.json").read_text())
    assert trace["traceEvents"]

    statuses = _statuses(work)
    order = [s["name"] for s in tuned["doc"]["steps"]]
    assert order == ["download", "patch", "smoke", "precision", "bench", "tune", "report"]
    assert statuses["tune"] == "ok"
    assert statuses["report"] == "ok"

    outputs = _steps(work)["tune"]["outputs"]
    assert outputs["step_us"] > 0
    assert outputs["arm"] == "eager"
    assert outputs["level"] == "light"
    assert len(outputs["recommendations"]) <= 3
    for rec in outputs["recommendations"]:
        assert set(rec) == {"id", "title", "estimated_speedup", "command"}

    report = (work / "report" / "report.md").read_text()
    assert "## Tuning" in report
    assert "ms** per decode step" in report
    for link in ("tune/profile.md", "tune/trace.json", "tune/breakdown.png"):
        assert f"(<{link}>)" in report, link
    assert "https://ui.perfetto.dev" in report
    for rec in outputs["recommendations"]:
        assert rec["title"] in report
        if rec.get("command"):
            assert rec["command"] in report

    # The run's page links the diagnosis page (both beside their markdown).
    page = (work / "report" / "report.html").read_text()
    assert 'href="tune/report.html"' in page
    assert 'href="bench.json"' in page

    doc = tuned["doc"]
    assert doc["tune"] == {
        "profile": str(tune_dir / "profile.json"),
        "markdown": str(tune_dir / "profile.md"),
        "html": str(tune_dir / "report.html"),
        "trace": str(tune_dir / "trace.json"),
        "torch_trace": str(tune_dir / "torch" / "trace.json"),
        "plot": str(tune_dir / "breakdown.png"),
    }


def test_a_rerun_reuses_the_tune_step_and_a_new_level_reruns_it(tuned, model):
    work = _fresh(tuned)
    before = _steps(work)["tune"]["outputs"]

    rc, out, err = _cli(work, model, "--tune", "--tune-iters", "1", "--json")
    assert rc == EXIT.OK, err
    statuses = {s["name"]: s["status"] for s in json.loads(out)["steps"]}
    assert statuses["bench"] == "reused"
    assert statuses["tune"] == "reused"
    assert statuses["report"] == "reused"
    assert json.loads(out)["tune"]["trace"] == str(work / "report" / "tune" / "trace.json")

    rc, out, err = _cli(
        work, model, "--tune", "--tune-iters", "1", "--tune-level", "detail", "--json"
    )
    assert rc == EXIT.OK, err
    statuses = {s["name"]: s["status"] for s in json.loads(out)["steps"]}
    assert statuses["bench"] == "reused"  # the measurement is not repeated
    assert statuses["tune"] == "ok"
    assert statuses["report"] == "ok"  # the new profile is what report.md shows
    after = _steps(work)["tune"]["outputs"]
    assert after["level"] == "detail" != before["level"]
    assert "(detail level)" in (work / "report" / "report.md").read_text()


def test_a_deleted_profile_reruns_the_tune_step(tuned, model):
    work = _fresh(tuned)
    (work / "report" / "tune" / "trace.json").unlink()
    rc, out, err = _cli(work, model, "--tune", "--tune-iters", "1", "--json")
    assert rc == EXIT.OK, err
    statuses = {s["name"]: s["status"] for s in json.loads(out)["steps"]}
    assert statuses["tune"] == "ok"
    assert (work / "report" / "tune" / "trace.json").is_file()


def test_without_tune_the_step_is_not_needed_and_the_report_has_no_tuning(tuned, model):
    """Dropping --tune after a tuned run: no stale Tuning section, no tune paths."""
    work = _fresh(tuned)
    rc, out, err = _cli(work, model, "--json")
    assert rc == EXIT.OK, err
    doc = json.loads(out)
    statuses = {s["name"]: s["status"] for s in doc["steps"]}
    assert statuses["bench"] == "reused"
    assert statuses["tune"] == "not-needed"
    assert statuses["report"] == "ok"
    assert doc["tune"] is None
    assert "## Tuning" not in (work / "report" / "report.md").read_text()


def _tune_fingerprint(tmp_path: Path, model: Path, **values) -> str:
    """The tune step's inputs digest, computed without running anything."""
    from pypto_e2e.manifest import fingerprint
    from pypto_e2e.state import RunState

    config = RunConfig.from_flat(
        work_dir=tmp_path / "w", model_path=str(model), skip=("download",), **values
    )
    state = RunState(config, None)
    state.outputs["patch"] = {"not_needed": True}
    return fingerprint(state.inputs("tune"))


def test_a_changed_bench_config_or_model_folder_reruns_the_tune_step(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(demo_model_dir(), model)
    base = _tune_fingerprint(tmp_path, model, tune=True, gen=8)
    assert _tune_fingerprint(tmp_path, model, tune=True, gen=8) == base
    assert _tune_fingerprint(tmp_path, model, tune=True, gen=16) != base
    assert _tune_fingerprint(tmp_path, model, tune=True, gen=8, tune_arm="graph") != base
    assert _tune_fingerprint(tmp_path, model, tune=True, gen=8, tune_iters=2) != base
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = bytes(b ^ 0x01 for b in data[-64:])
    weights.write_bytes(bytes(data))
    assert _tune_fingerprint(tmp_path, model, tune=True, gen=8) != base
    # Without --tune the step does not depend on the bench at all.
    assert _tune_fingerprint(tmp_path, model, gen=8) == _tune_fingerprint(tmp_path, model, gen=16)
    assert not (tmp_path / "w" / MANIFEST_NAME).exists()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tune_arm": "sideways"}, "unknown --tune-arm 'sideways'"),
        ({"tune_arm": ""}, "unknown --tune-arm ''"),
        ({"tune_level": "deep"}, "unknown --tune-level 'deep'"),
        ({"tune_iters": 0}, "--tune-iters must be an integer >= 1"),
        ({"tune_iters": -3}, "--tune-iters must be an integer >= 1"),
        ({"skip": ("download", "bench")}, "--tune profiles the bench's step"),
    ],
)
def test_bad_tune_settings_are_refused_before_anything_runs(tmp_path, values, message):
    work = tmp_path / "work"
    settings = {"work_dir": work, "model_path": str(tmp_path / "absent"), "skip": ("download",)}
    settings.update(values)
    with pytest.raises(BadRunInputError, match=message) as info:
        run(RunConfig.from_flat(tune=True, **settings))
    assert info.value.exit_code == EXIT.USAGE
    assert not work.exists()


@pytest.mark.parametrize(
    "flags",
    [
        ["--tune-arm", "eagre"],
        ["--tune-level", "verbose"],
        ["--tune-iters", "0"],
    ],
)
def test_bad_tune_flags_exit_usage_with_one_line(tmp_path, model, flags):
    work = tmp_path / "work"
    rc, out, err = _cli(work, model, "--tune", *flags)
    assert rc == EXIT.USAGE
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert flags[0] in lines[0]
    assert not work.exists()


def test_a_failing_profile_is_the_tune_step_s_failure_and_keeps_the_bench(tmp_path, model):
    """A real pypto-tune failure: the graph arm profiled with a CUDA-only backend on CPU
    (the bench measured eager only, so it ran). The bench report stays; the resume hint
    names dropping --tune."""
    work = tmp_path / "work"
    rc, out, err = _cli(
        work,
        model,
        "--graph-backend",
        "cudagraph",
        "--tune",
        "--tune-arm",
        "graph",
        "--tune-iters",
        "1",
        "--json",
    )
    assert rc == EXIT.TUNE_FAILED, err
    error = json.loads(out)["error"]
    assert error["name"] == "TUNE_FAILED"
    assert error["step"] == "tune"
    assert error["cause"]["tool"] == "pypto-tune"
    assert error["cause"]["name"] == "PROFILE_FAILED"
    assert "drop --tune" in error["message"]
    statuses = _statuses(work)
    assert statuses["bench"] == "ok"
    assert statuses["tune"] == "failed"
    assert "report" not in statuses
    assert (work / "report" / "bench.json").is_file()
    assert not (work / "report" / "tune" / "profile.json").exists()


def test_an_unwritable_tune_folder_is_a_tune_failure(tuned, model):
    """`report/tune` taken by a file: one line naming the folder, TUNE_FAILED."""
    work = _fresh(tuned)
    shutil.rmtree(work / "report" / "tune")
    (work / "report" / "tune").write_text("not a folder")
    rc, _out, err = _cli(work, model, "--tune", "--tune-iters", "1", "--tune-level", "detail")
    assert rc == EXIT.TUNE_FAILED, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("pypto-e2e: error: step 'tune' failed:")
    assert str(work / "report" / "tune") in last
    assert _statuses(work)["tune"] == "failed"


def _run_python(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ),
        timeout=180,
    )


# pypto-tune absent, blocked the way Python documents: a None entry in sys.modules.
_NO_TUNE = "import sys; sys.modules['pypto_tune'] = None\nfrom pypto_e2e.cli import main\n"


def test_tune_without_pypto_tune_names_the_install_before_any_step(tmp_path, model):
    work = tmp_path / "work"
    argv = ["run", "--work-dir", str(work), "--model-path", str(model)]
    argv += ["--skip", "download,smoke", "--tune"]
    proc = _run_python(_NO_TUNE + f"sys.exit(main({argv!r}))", tmp_path)
    assert proc.returncode == EXIT.ENVIRONMENT, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "pip install 'pypto-e2e[tune]'" in lines[0]
    assert proc.stdout == ""
    assert not work.exists()


def test_a_run_without_tune_needs_no_pypto_tune(tmp_path, model):
    """The extra is optional: without --tune nothing imports pypto_tune."""
    work = tmp_path / "work"
    argv = ["run", "--work-dir", str(work), "--model-path", str(model)]
    argv += ["--skip", "download,smoke,bench"]
    proc = _run_python(_NO_TUNE + f"sys.exit(main({argv!r}))", tmp_path)
    assert proc.returncode == EXIT.OK, proc.stderr
    assert _statuses(work)["tune"] == "not-needed"


def test_the_tuning_section_keeps_hostile_commands_in_one_code_span(tmp_path):
    """A command quoting a path with backticks and spaces must not break out of its span."""
    assert _code("a ` b") == "``a ` b``"
    assert _code("`x`") == "`` `x` ``"
    report_dir = tmp_path / "report"
    tune = {
        "arm": "eager",
        "level": "light",
        "step_us": 1500.0,
        "step_unit": "decode step (one token)",
        "files": {
            "markdown": str(report_dir / "tune" / "profile.md"),
            "trace": str(report_dir / "tune" / "trace.json"),
        },
        "recommendations": [
            {
                "id": "graph_arm",
                "title": "run the graph arm",
                "estimated_speedup": 1.5,
                "command": "pypto-bench run --model-path '/m/``odd`` dir'",
            },
            {"id": "x", "title": "no estimate", "estimated_speedup": None, "command": None},
        ],
    }
    text = "\n".join(tuning_section(tune, report_dir))
    assert "**1.50 ms** per decode step (one token)" in text
    assert "(~1.50x, `graph_arm`)" in text
    assert "command: ```pypto-bench run --model-path '/m/``odd`` dir'```" in text
    assert "(not estimated, `x`)" in text
    assert "[tune/profile.md](<tune/profile.md>)" in text
    assert "breakdown" not in text  # no plot written, none linked
