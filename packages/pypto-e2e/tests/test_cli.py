"""The CLI edge: shell-safe stdout, exit codes by name, redaction, the optional demo extra."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from pypto_common import EXIT_RANGES
from pypto_e2e import EXIT, MANIFEST_NAME
from pypto_e2e.cli import main
from pypto_e2e.demo import demo_model_dir


def test_exit_codes_are_pypto_e2e_s_own_range():
    names = {e.name for e in EXIT}
    for name in (
        "DOWNLOAD_FAILED",
        "PATCH_FAILED",
        "REMOTE_CODE_REFUSED",
        "SMOKE_FAILED",
        "BENCH_FAILED",
        "ARM_FAILED",
        "REPORT_FAILED",
    ):
        assert name in names
    for entry in EXIT:
        assert entry.code <= 3 or entry.code in EXIT_RANGES["pypto-e2e"], entry


def test_export_lines_are_quoted_for_eval(tmp_path, capsys):
    """A work dir with a space and `$(touch pwned)` in its name must stay a name under eval."""
    hostile = tmp_path / "it's a $(touch pwned) dir"
    model = hostile / "model"
    shutil.copytree(demo_model_dir(), model)
    rc = main(
        [
            "run",
            "--work-dir",
            str(hostile / "work"),
            "--model-path",
            str(model),
            "--skip",
            "download,smoke,bench",
        ]
    )
    out = capsys.readouterr().out
    assert rc == EXIT.OK
    script = 'eval "$1"\nprintf %s "$MODEL_PATH"'
    proc = subprocess.run(
        ["sh", "-c", script, "sh", out], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == str(model)
    assert not (tmp_path / "pwned").exists()
    assert not any(p.name == "pwned" for p in tmp_path.rglob("pwned"))


def test_bad_input_with_json_names_the_cause_and_leaks_no_secret(tmp_path, capsys):
    token = "hf_SuperSecretToken123456"
    rc = main(
        [
            "run",
            "--model-id",
            "bad//id",
            "--work-dir",
            str(tmp_path / "w"),
            "--token",
            token,
            "--endpoint",
            "http://alice:pa55word-xyz@127.0.0.1:9",
            "--json",
        ]
    )
    captured = capsys.readouterr()
    assert rc == EXIT.USAGE
    doc = json.loads(captured.out)
    assert doc["ok"] is False
    assert doc["error"]["name"] == "USAGE"
    assert doc["error"]["cause"]["tool"] == "pypto-download"
    assert len(captured.err.strip().splitlines()) == 1
    for secret in (token, "pa55word-xyz"):
        assert secret not in captured.out + captured.err
    assert not (tmp_path / "w").exists()


def _run_python(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYPTO_DEMO_WORKDIR": str(tmp_path / "demo-work")},
        timeout=120,
    )


def test_library_code_does_not_import_test_helpers(tmp_path):
    proc = _run_python(
        "import sys, pypto_e2e, pypto_e2e.cli, pypto_e2e.pipeline;"
        "print(sorted(m for m in sys.modules if m.startswith('pypto_testing')))",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_demo_without_the_extra_names_the_install(tmp_path):
    """pypto-testing absent (blocked the way Python documents: a None entry in sys.modules)."""
    proc = _run_python(
        "import sys; sys.modules['pypto_testing'] = None; sys.modules['pypto_testing.hub'] = None\n"
        "from pypto_e2e.cli import main; sys.exit(main(['demo']))",
        tmp_path,
    )
    assert proc.returncode == EXIT.ENVIRONMENT, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "pip install 'pypto-e2e[demo]'" in lines[0]
    assert proc.stdout == ""
    assert not (tmp_path / "demo-work").exists()
    assert not (tmp_path / "pypto-demo-work").exists()


@pytest.mark.parametrize("flag", ["--compile-mode", "--ignore-eos", "--no-bandwidth"])
def test_bench_flags_come_from_pypto_bench(flag):
    from pypto_e2e.cli import build_parser, run_config_from_args

    extra = [flag, "max-autotune-no-cudagraphs"] if flag == "--compile-mode" else [flag]
    args = build_parser().parse_args(["run", "--model-id", "a/b", "--work-dir", "w", *extra])
    bench = run_config_from_args(args, ["pypto-e2e"]).bench
    assert bench.compile_mode == (
        "max-autotune-no-cudagraphs" if flag == "--compile-mode" else None
    )
    assert bench.ignore_eos is (flag == "--ignore-eos")
    assert bench.measure_bandwidth is (flag != "--no-bandwidth")


def test_changing_ignore_eos_invalidates_the_bench_step_only(tmp_path):
    """Inputs are compared without running the bench: the fingerprint of each step."""
    from pypto_e2e.manifest import fingerprint
    from pypto_e2e.state import RunState

    model = tmp_path / "model"
    shutil.copytree(demo_model_dir(), model)

    def inputs(ignore_eos: bool) -> dict[str, str]:
        from pypto_e2e import RunConfig

        config = RunConfig.from_flat(
            work_dir=tmp_path / "w",
            model_path=str(model),
            skip=("download",),
            ignore_eos=ignore_eos,
        )
        state = RunState(config, None)
        state.outputs["patch"] = {"not_needed": True}
        return {s: fingerprint(state.inputs(s)) for s in ("patch", "smoke", "bench")}

    off, on = inputs(False), inputs(True)
    assert off["patch"] == on["patch"]
    assert off["smoke"] == on["smoke"]
    assert off["bench"] != on["bench"]
    assert not (tmp_path / "w" / MANIFEST_NAME).exists()


@pytest.mark.parametrize(
    ("extra", "want"),
    [([], None), (["--precision"], "cpu"), (["--precision", "--reference", "cuda:1"], "cuda:1")],
)
def test_precision_asks_the_bench_for_a_cpu_reference(extra, want):
    from pypto_e2e.cli import build_parser, run_config_from_args

    args = build_parser().parse_args(["run", "--model-id", "a/b", "--work-dir", "w", *extra])
    assert run_config_from_args(args, ["pypto-e2e"]).bench.reference == want


def test_a_run_with_precision_reports_the_reference_check(tmp_path, e2e_cli):
    """The demo model through patch and bench with --precision: the bench report carries the
    eager arm's check against the CPU float64 reference and report.md says it; the bench
    step's inputs include it (a run without it is not reused)."""
    model = tmp_path / "model"
    shutil.copytree(demo_model_dir(), model)
    work = tmp_path / "w"
    argv = ["run", "--model-path", str(model), "--work-dir", str(work), "--skip",
            "download,smoke", "--device", "cpu", "--arms", "eager", "--seq", "8", "--gen", "4",
            "--warmup", "0", "--iters", "1", "--no-bandwidth", "--precision"]  # fmt: skip
    code, _, err = e2e_cli(*argv)
    assert code == EXIT.OK, err
    bench = json.loads((work / "report" / "bench.json").read_text())
    check = bench["reference_check"]
    assert check["verdict"] == "pass", check
    assert check["device"] == "cpu"
    assert check["dtype"] == "float64"
    assert bench["config"]["reference"] == "cpu"
    assert "`eager` numerics vs cpu float64: pass" in (work / "report" / "report.md").read_text()
