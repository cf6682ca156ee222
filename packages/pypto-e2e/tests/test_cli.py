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


def _precision_run(model, work) -> list[str]:
    """A run through patch, precision and an eager-only bench of ``model`` (no download)."""
    return ["run", "--model-path", str(model), "--work-dir", str(work), "--skip",
            "download,smoke", "--device", "cpu", "--arms", "eager", "--seq", "8", "--gen", "4",
            "--warmup", "0", "--iters", "1", "--no-bandwidth"]  # fmt: skip


def test_the_precision_step_checks_the_eager_model_against_the_cpu(tmp_path, e2e_cli):
    """The demo model through patch, precision and bench: the precision step (between smoke
    and bench) compares the run's dtype with the CPU float64 reference, writes check.json
    and check.md, and report.md and the page show its verdict; a second run reuses it."""
    model = tmp_path / "model"
    shutil.copytree(demo_model_dir(), model)
    work = tmp_path / "w"
    argv = _precision_run(model, work)
    code, _, err = e2e_cli(*argv)
    assert code == EXIT.OK, err
    manifest = json.loads((work / MANIFEST_NAME).read_text())
    from pypto_e2e.config import STEPS

    assert STEPS.index("precision") == STEPS.index("smoke") + 1
    assert manifest["steps"]["precision"]["status"] == "ok"
    check = json.loads((work / "report" / "precision" / "check.json").read_text())
    assert check["ok"] is True
    assert check["reference"]["device"] == "cpu"
    assert check["reference"]["dtype"] == "float64"  # a small model: the float64 reference
    assert check["logits"]["metrics"]["kl_max"] < 1e-9  # float32 against float64
    md = (work / "report" / "report.md").read_text()
    assert "`eager` numerics vs cpu float64: pass" in md
    page = (work / "report" / "report.html").read_text()
    assert "Numerics: the reference device" in page
    assert "precision/check.md" in page
    code, _, err = e2e_cli(*argv)  # unchanged inputs: reused, not run again
    assert code == EXIT.OK, err
    assert "[precision] reused from the previous run" in err


def test_a_precision_step_that_sees_non_finite_logits_stops_the_run(tmp_path, e2e_cli):
    """A weight that holds an infinity (layer 1's MLP down projection): the logits are not
    finite; the precision step fails the run before the bench (non-finite logits fail,
    always), names check.md, and says how to go on anyway; --allow-inaccurate continues,
    the verdict kept in the manifest."""
    from safetensors.torch import load_file, save_file

    from pypto_testing.models import make_tiny_model

    model = make_tiny_model(tmp_path / "inf", num_hidden_layers=2)
    weights = load_file(str(model / "model.safetensors"))
    weights["model.layers.1.mlp.down_proj.weight"][0, 0] = float("inf")
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    work = tmp_path / "w"
    argv = _precision_run(model, work)
    code, _, err = e2e_cli(*argv)
    assert code == EXIT.ARM_FAILED, err
    assert "step 'precision' failed: the eager model's logits diverge from the CPU" in err
    assert "non-finite" in err
    assert (work / "report" / "precision" / "check.md").is_file()
    assert not (work / "report" / "bench.json").exists()  # nothing measured
    code, _, err = e2e_cli(*argv, "--allow-inaccurate")
    manifest = json.loads((work / MANIFEST_NAME).read_text())
    assert manifest["steps"]["precision"]["status"] == "ok"
    assert "allowed by --allow-inaccurate" in manifest["steps"]["precision"]["note"]
