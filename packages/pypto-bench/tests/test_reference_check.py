"""``pypto-bench run --reference DEVICE`` (pypto_bench.reference): the eager arm's logits
against the same folder on a trusted device, teacher-forced, judged against the noise floor,
on real tiny Llama folders: a correct target passes in float32 and bfloat16, a target whose
own model is 1% off in one layer fails, names the module and exits like a numerics failure
(the real CLI, a real process), and bad requests are one line."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from pypto_bench import EXIT, BenchConfig, format_table, report_to_markdown, run_bench
from pypto_bench.report import validate_report
from pypto_testing.models import make_tiny_model
from pypto_testing.planted import plant_first_load_error

BIN = Path(sys.executable).parent
FAST = ["--device", "cpu", "--seq", "8", "--gen", "4", "--warmup", "0", "--iters", "1",
        "--no-bandwidth"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("reference") / "tiny", num_hidden_layers=2)


@pytest.fixture(scope="module")
def planted(tiny, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("planted") / "tiny"
    shutil.copytree(tiny, folder)
    plant_first_load_error(folder, layer=1, factor=1.01)
    return folder


def _config(folder: Path, **values) -> BenchConfig:
    base = dict(model_path=str(folder), device="cpu", seq=8, gen=4, warmup=0, iters=1,
                arms=("eager", "graph"), graph_backend="eager", measure_bandwidth=False,
                reference="cpu")  # fmt: skip
    return BenchConfig(**{**base, **values})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_correct_target_passes_against_the_cpu_reference(tiny, dtype):
    report = run_bench(_config(tiny, dtype=dtype))
    check = report.reference_check
    assert check is not None
    assert check["verdict"] == "pass", check
    assert check["dtype"] == "float64"  # a tiny model: the float64 reference
    assert check["target"] == {"device": "cpu", "dtype": dtype}
    assert check["floor"] == {"device": "cpu", "dtype": dtype}
    m = check["metrics"]
    assert m["steps"] == 4
    assert m["top1_agreement"] == 1.0
    assert m["kl_max"] <= check["allowed_kl_max"]
    if dtype == "float32":
        assert m["kl_max"] < 1e-9
    else:  # bf16 has its own error against float64, and is allowed twice the floor's
        assert m["kl_max"] > 1e-9
        assert check["allowed_kl_max"] >= 2 * check["floor_metrics"]["kl_max"]
    # the graph arm keeps its own verdict against eager
    assert report.arm("graph").numerics["verdict"] == "pass"
    data = report.to_dict()
    validate_report(data)
    assert "eager: numerics vs cpu float64: pass (KL p99" in format_table(report)
    assert "- `eager` numerics vs cpu float64: pass" in report_to_markdown(report)


def test_prefill_is_checked_at_every_prompt_position(tiny):
    report = run_bench(_config(tiny, regime="prefill", arms=("eager",)))
    check = report.reference_check
    assert check["verdict"] == "pass", check
    assert check["metrics"]["steps"] == 8  # every prompt position


def test_a_wrong_target_fails_names_the_module_and_exits_inaccurate(planted, tmp_path):
    """The run's model (the first copy the process loads) has layer 1's MLP 1% off; the
    reference and the floor, loaded after it, are right: its greedy tokens survive, its
    logits do not. The real CLI exits INACCURATE, the page says so, and the command it
    prints for the user runs."""
    out = tmp_path / "r.json"
    run = [str(BIN / "pypto-bench"), "run", "--model-path", str(planted), "--trust-remote-code",
           "--arms", "eager", "--reference", "cpu", "--report-file", str(out), "--html",
           str(tmp_path / "r.html"), *FAST]  # fmt: skip
    done = subprocess.run(run, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == EXIT.INACCURATE, done.stderr
    check = json.loads(out.read_text())["reference_check"]
    assert check["verdict"] == "fail", check
    assert check["metrics"]["top1_agreement"] == 1.0  # the tokens would have passed it
    assert check["first_diverging_module"] == "model.layers.1.mlp#0"
    assert "first diverging module: model.layers.1.mlp#0" in done.stderr
    page = (tmp_path / "r.html").read_text()
    assert "Numerics: the reference device" in page
    assert "model.layers.1.mlp#0" in page
    # the command the error line hands the user exists and runs to a verdict (in its own
    # process the first copy this planted folder builds is check's reference, so which
    # verdict says nothing about the device: it stands in for one here)
    line = next(ln for ln in done.stderr.splitlines() if "look there with `" in ln)
    command = shlex.split(line.split("look there with `")[1].split("`")[0])
    assert command[0] == "pypto-precision"
    command[command.index("--out") + 1] = str(tmp_path / "check")
    again = subprocess.run([str(BIN / command[0]), *command[1:]], capture_output=True,
                           text=True, timeout=600, check=False)  # fmt: skip
    assert again.returncode in (0, 100), again.stderr  # pass or DIVERGED, not an error
    assert json.loads((tmp_path / "check" / "check.json").read_text())["target"]["dtype"]
    # --allow-inaccurate: exit 0, said
    allowed = subprocess.run([*run[:-len(FAST)], "--allow-inaccurate", *FAST],
                             capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert allowed.returncode == EXIT.OK, allowed.stderr
    assert "allowed by --allow-inaccurate" in allowed.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--regime", "diffusion-generate"], "--reference compares decode and prefill"),
        (["--nproc", "2"], "--reference runs in one process"),
        (["--reference", "nosuchdevice:0"], "--reference nosuchdevice:0"),
    ],
)
def test_bad_reference_requests_are_one_line(tiny, tmp_path, extra, message):
    argv = [str(BIN / "pypto-bench"), "run", "--model-path", str(tiny), "--reference", "cpu",
            "--report-file", str(tmp_path / "r.json"), *FAST, *extra]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == EXIT.USAGE, done.stderr
    errors = [ln for ln in done.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1, done.stderr
    assert message in errors[0]
    assert not (tmp_path / "r.json").exists()
