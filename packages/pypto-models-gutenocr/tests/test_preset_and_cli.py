import json
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from pypto_models_gutenocr import EXIT
from pypto_models_gutenocr.cli import main
from pypto_models_gutenocr.preset import PRESET
from pypto_testing.gutenocr import cli_argv


def test_preset_is_registered_and_well_formed():
    eps = [ep for ep in entry_points(group="pypto.model_families") if ep.name == "gutenocr_3b"]
    assert len(eps) == 1
    assert eps[0].load() is PRESET
    assert PRESET["family"] == "gutenocr_3b"
    assert set(PRESET["auto_map"]) == {
        "AutoConfig",
        "AutoModelForCausalLM",
        "AutoModelForImageTextToText",
    }
    for target in PRESET["auto_map"].values():
        module = target.split(".")[0] + ".py"
        assert module in PRESET["files"]


def test_placed_files_load_through_auto_classes_with_remote_code(tiny_gutenocr, tmp_path):
    import shutil

    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    folder = tmp_path / "patched"
    shutil.copytree(tiny_gutenocr, folder)
    for name, text in PRESET["files"].items():
        (folder / name).write_text(text)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = PRESET["auto_map"]
    (folder / "config.json").write_text(json.dumps(cfg))
    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
        model = auto.from_pretrained(str(folder), trust_remote_code=True, local_files_only=True)
        assert type(model).__name__ == "GutenOCRForConditionalGeneration"
        assert model.pypto_kernel_family == "gutenocr"


def test_ask_text_end_to_end(tiny_gutenocr, tmp_path, capsys):
    report_file = tmp_path / "r.json"
    rc = main(
        cli_argv(
            "ask",
            tiny_gutenocr,
            "--report-file",
            str(report_file),
            "--json",
            warmup=1,
            output_length=4,
            batch=2,
        )
    )
    assert rc == EXIT.OK
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads(report_file.read_text())
    assert report["tokens"] == 8
    assert report["batch"] == 2
    assert len(report["text"]) == 2
    assert report["graph"]["graph"] == "eager"
    assert report["prompt"] == "你好"


def test_ask_image_with_pto_and_dynamic_policy(tiny_gutenocr, tiny_image, capsys, monkeypatch):
    monkeypatch.setenv("PYPTO_GUTENOCR_CPU_SIM", "0")
    rc = main(
        cli_argv(
            "ask",
            tiny_gutenocr,
            "--use_pto",
            "--use_dynamic_config",
            "--json",
            warmup=0,
            output_length=2,
            image=tiny_image,
            runs=1,
            backend="eager",
        )
    )
    assert rc == EXIT.OK
    report = json.loads(capsys.readouterr().out)
    assert report["image"] == str(tiny_image)
    from pypto_kernels_gutenocr import DynamicPTOConfig

    decision = DynamicPTOConfig.default().for_batch(1)
    assert report["switch_policy"]["switches"] == decision.switches
    assert report["switch_policy"]["reason"] == decision.reason
    calls = report["kernels"]["calls"]
    assert calls["swiglu_mlp"]["reference"] == (4 if decision.switches["swiglu_mlp"] else 0)
    assert calls["rms_norm"]["reference"] == (10 if decision.switches["rms_norm"] else 0)
    assert "PYPTO_GUTENOCR_CPU_SIM=0" in report["kernels"]["fallback_reasons"]["swiglu_mlp"]


def test_use_acl_graph_says_which_graph_ran(tiny_gutenocr, capsys):
    rc = main(
        cli_argv(
            "ask",
            tiny_gutenocr,
            "--use_acl_graph",
            "--json",
            warmup=0,
            output_length=2,
            backend="eager",
        )
    )
    assert rc == EXIT.OK
    graph = json.loads(capsys.readouterr().out)["graph"]
    assert graph["graph"] in ("torchair", "torch.compile")
    if graph["graph"] == "torch.compile":
        assert "torchair is not installed" in graph["note"]


def test_bench_writes_two_reports_and_a_summary(tiny_gutenocr, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYPTO_GUTENOCR_CPU_SIM", "0")
    out = tmp_path / "bench"
    rc = main(
        cli_argv(
            "bench",
            tiny_gutenocr,
            "--output-dir",
            str(out),
            "--json",
            warmup=1,
            runs=2,
            output_length=3,
        )
    )
    assert rc == EXIT.OK
    summary = json.loads(capsys.readouterr().out)
    assert json.loads((out / "summary.json").read_text()) == summary
    base, pto = (json.loads((out / f).read_text()) for f in ("baseline.json", "pypto.json"))
    assert not base["use_pto"]
    assert pto["use_pto"]
    assert len(pto["generate_s_all"]) == 2
    m = summary["metrics"]
    assert set(m) == {"load_s", "generate_s", "tokens", "tok_per_s", "peak_memory_bytes"}
    assert m["tokens"]["baseline"] == 3
    assert m["tokens"]["delta_pct"] == 0.0
    assert summary["pypto_kernels"]["calls"]["rms_norm"]["reference"] > 0


@pytest.mark.parametrize(
    ("args", "code", "msg"),
    [
        (["--model-path", "/nonexistent"], "USAGE", "not a model folder"),
        (["--image", "/nonexistent.png"], "USAGE", "no such file"),
        (["--device", "cuda:3"], "ENVIRONMENT", "cuda:3 requested but no CUDA device"),
        (["--device", "gpu"], "USAGE", "unknown device 'gpu'"),
        (["--device", "npu:x"], "USAGE", "unknown device 'npu:x'"),
        (["--dtype", "float64x"], "USAGE", "--dtype 'float64x'"),
    ],
)
def test_bad_input_is_one_line_with_exit_code(tiny_gutenocr, capsys, args, code, msg):
    base = cli_argv("ask", tiny_gutenocr, warmup=0, output_length=1)
    rc = main(base + args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == getattr(EXIT, code)
    assert msg in err[-1]
    assert err[-1].startswith("pypto-gutenocr:")


def test_ask_device_0_is_the_first_card_or_the_cpu(tiny_gutenocr, capsys):
    """A bare card number (the original scripts' form): npu:0, else cuda:0, else the CPU."""
    import torch

    from pypto_capture import npu_available

    rc = main(cli_argv("ask", tiny_gutenocr, "--json", device="0", warmup=0, output_length=2))
    assert rc == EXIT.OK, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    expected = "npu:0" if npu_available() else "cuda:0" if torch.cuda.is_available() else "cpu"
    assert report["device"] == expected
    assert report["tokens"] == 2
    assert report["generate_s_stats"]["mean"] == report["generate_s"]


def test_broken_weights_are_one_line_load_failed(tiny_gutenocr, tmp_path, capsys):
    import shutil

    folder = tmp_path / "broken"
    shutil.copytree(tiny_gutenocr, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # an interrupted download
    before = sorted(p.name for p in folder.iterdir())
    rc = main(["ask", "--model-path", str(folder), "--device", "cpu", "--warmup", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EXIT.LOAD_FAILED
    assert err[-1].startswith("pypto-gutenocr:")
    assert "did not load" in err[-1]
    assert "re-download" in err[-1]
    assert sorted(p.name for p in folder.iterdir()) == before


def test_unusable_policy_file_is_bad_usage(tiny_gutenocr, tmp_path, capsys):
    policy = tmp_path / "policy.json"
    policy.write_text("{not json")
    rc = main(
        cli_argv(
            "ask",
            tiny_gutenocr,
            "--use_pto",
            "--use_dynamic_config",
            "--policy-file",
            str(policy),
            warmup=0,
            output_length=1,
        )
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EXIT.USAGE
    assert err[-1].startswith("pypto-gutenocr:")
    assert str(policy) in err[-1]


def test_exit_codes_are_in_pypto_gutenocrs_range_and_listed_in_help():
    from pypto_common import EXIT_RANGES

    assert EXIT.tool == "pypto-gutenocr"
    for name in ("KERNEL_FAILED", "LOAD_FAILED"):
        assert getattr(EXIT, name) in EXIT_RANGES["pypto-gutenocr"]
    out = subprocess.run(
        [sys.executable, "-m", "pypto_models_gutenocr", "--help"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == EXIT.OK
    assert f"{EXIT.KERNEL_FAILED} KERNEL_FAILED" in " ".join(out.stdout.split())


def test_missing_model_path_names_the_env_var(monkeypatch, capsys):
    monkeypatch.delenv("GUTENOCR_MODEL_PATH", raising=False)
    assert main(["ask"]) == EXIT.USAGE
    assert "GUTENOCR_MODEL_PATH" in capsys.readouterr().err


def test_console_script_is_installed():
    out = subprocess.run(
        [sys.executable, "-m", "pypto_models_gutenocr.cli", "--help"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == EXIT.OK
    assert "bench" in out.stdout
