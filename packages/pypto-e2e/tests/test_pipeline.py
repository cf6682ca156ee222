"""pypto-e2e's own logic without the network: validation, reuse and re-run decisions,
remote-code gating, the demo preset and the embedded demo model (the integration tests
run the whole flow against a local hub)."""

from __future__ import annotations

import json
import shutil

import pytest

from pypto_e2e import (
    EXIT,
    MANIFEST_NAME,
    BadRunInputError,
    RunConfig,
    StepFailedError,
    run,
)
from pypto_e2e.demo import demo_model_dir
from pypto_e2e.demo_preset import PRESET

ONLY_PATCH = ("download", "smoke", "precision", "bench")


@pytest.fixture
def model_copy(tmp_path):
    dest = tmp_path / "model"
    shutil.copytree(demo_model_dir(), dest)
    return dest


@pytest.fixture(autouse=True)
def _modules_cache(tmp_path, monkeypatch):
    """Remote code (if any ran) lands in a per-test module cache, not the user's."""
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))


def _statuses(work):
    steps = json.loads((work / MANIFEST_NAME).read_text())["steps"]
    return {k: v["status"] for k, v in steps.items()}


def _config(**values):
    return RunConfig.from_flat(**values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "--model-id ORG/REPO is required"),
        ({"model_id": "a/b", "skip": ("nope",)}, "unknown step 'nope'"),
        (
            {"model_id": "a/b", "from_step": "bench", "skip": ("bench",)},
            "--from bench names a step",
        ),
        ({"model_id": "a/b", "family": "x", "auto_map": {"A": "m.C"}}, "exclusive"),
        (
            {"model_id": "a/b", "fuse": True, "skip": ("bench",)},
            "--fuse measures in the bench step",
        ),
        ({"model_id": "a/b", "gen": 0}, "--gen must be >= 1"),
        ({"model_id": "a/b", "regime": "sideways"}, "unknown regime 'sideways'"),
        ({"model_id": "not a model id!"}, "malformed model id"),
        ({"model_id": "a/b", "endpoint": "ftp://mirror"}, "not an http\\(s\\) URL"),
        ({"model_id": "a/b", "family": "no_such_family"}, "unknown model family"),
    ],
)
def test_bad_requests_fail_before_anything_is_written(tmp_path, values, message):
    work = tmp_path / "work"
    with pytest.raises(BadRunInputError, match=message) as info:
        run(_config(work_dir=work, **values))
    assert info.value.exit_code == EXIT.USAGE
    assert not work.exists()


def test_a_malformed_model_id_is_bad_usage_with_the_download_tool_as_cause(tmp_path):
    """Used to exit 10 (pypto-download's code), which e2e's README called "load failed"."""
    with pytest.raises(BadRunInputError) as info:
        run(_config(work_dir=tmp_path / "w", model_id="bad//id"))
    err = info.value.to_dict()
    assert err["exit_code"] == EXIT.USAGE
    assert err["name"] == "USAGE"
    assert err["cause"]["tool"] == "pypto-download"
    import pypto_download

    assert err["cause"]["code"] == pypto_download.InvalidModelIdError.exit_code


def test_fuse_adds_the_fused_arm_to_the_same_run():
    config = _config(work_dir="w", model_id="a/b", arms=("eager",), fuse=True)
    assert config.effective_arms == ("eager", "graph", "pypto+graph")


def test_bench_settings_are_pypto_bench_s_own_config():
    from pypto_bench import BenchConfig

    config = _config(work_dir="w", model_id="a/b", compile_mode="max-autotune", ignore_eos=True)
    assert isinstance(config.bench, BenchConfig)
    bench = config.bench_config(model_path="/m", report_file="/r.json", trust_remote_code=True)
    assert (bench.compile_mode, bench.ignore_eos, bench.model_path) == ("max-autotune", True, "/m")
    assert bench.trust_remote_code is True


def test_the_model_path_is_passed_explicitly_never_through_the_environment(
    tmp_path, model_copy, monkeypatch
):
    monkeypatch.delenv("MODEL_PATH", raising=False)
    run(_config(work_dir=tmp_path / "w", model_path=str(model_copy), skip=ONLY_PATCH))
    import os

    assert "MODEL_PATH" not in os.environ


def test_patch_only_run_is_reused_then_rerun_when_forced(tmp_path, model_copy):
    work = tmp_path / "work"
    base = {"work_dir": work, "model_path": str(model_copy), "skip": ONLY_PATCH}
    first = run(_config(family="pypto_demo", **base))
    assert _statuses(work) == {
        "download": "skipped",
        "patch": "ok",
        "smoke": "skipped",
        "precision": "skipped",
        "bench": "skipped",
        "tune": "not-needed",
        "report": "not-needed",
    }
    patched = work / "patched"
    assert first.model_path == patched
    auto_map = json.loads((patched / "config.json").read_text())["auto_map"]
    assert auto_map == PRESET["auto_map"]
    assert "auto_map" not in json.loads((model_copy / "config.json").read_text())  # overlay
    assert first.remote_code.startswith("only the pinned shims of pypto_demo")

    again = run(_config(family="pypto_demo", **base))
    assert [s.status for s in again.steps if s.name == "patch"] == ["reused"]
    forced = run(_config(family="pypto_demo", from_step="patch", **base))
    assert [s.status for s in forced.steps if s.name == "patch"] == ["ok"]


def test_an_edited_overlay_is_pinned_afresh(tmp_path, model_copy):
    """The patch step's output folder is fingerprinted too: a hand edit re-runs it."""
    work = tmp_path / "work"
    base = {"work_dir": work, "model_path": str(model_copy), "skip": ONLY_PATCH}
    run(_config(family="pypto_demo", **base))
    shim = work / "patched" / "modeling_pypto_demo.py"
    shim.write_text("import os  # not the preset's shim\n")
    again = run(_config(family="pypto_demo", **base))
    assert [s.status for s in again.steps if s.name == "patch"] == ["ok"]
    assert shim.read_text() == PRESET["files"]["modeling_pypto_demo.py"]


def test_a_native_model_needs_no_pinning(tmp_path, model_copy):
    work = tmp_path / "work"
    result = run(_config(work_dir=work, model_path=str(model_copy), skip=ONLY_PATCH))
    patch = next(s for s in result.steps if s.name == "patch")
    assert patch.status == "not-needed"
    assert "no code of its own" in patch.note
    assert result.model_path == model_copy.resolve()
    assert result.remote_code == "off"


@pytest.mark.parametrize(
    ("file", "auto_map"),
    [
        ("config.json", {"AutoModelForCausalLM": "modeling_remote.Remote"}),
        ("tokenizer_config.json", {"AutoTokenizer": ["tokenization_remote.Tok", None]}),
    ],
)
def test_remote_code_without_preset_is_refused_and_names_the_flags(
    tmp_path, model_copy, file, auto_map
):
    cfg = json.loads((model_copy / file).read_text())
    cfg["auto_map"] = auto_map
    (model_copy / file).write_text(json.dumps(cfg))
    work = tmp_path / "work"
    with pytest.raises(StepFailedError, match="step 'patch' failed") as info:
        run(_config(work_dir=work, model_path=str(model_copy), skip=("download",)))
    assert info.value.exit_code == EXIT.REMOTE_CODE_REFUSED
    assert "--family" in str(info.value)
    assert "--trust-remote-code" in str(info.value)
    assert file in str(info.value)
    assert _statuses(work)["patch"] == "failed"
    assert "smoke" not in _statuses(work)


def test_trust_remote_code_lets_an_unpinned_folder_through(tmp_path, model_copy):
    cfg = json.loads((model_copy / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_remote.Remote"}
    (model_copy / "config.json").write_text(json.dumps(cfg))
    result = run(
        _config(
            work_dir=tmp_path / "w",
            model_path=str(model_copy),
            skip=ONLY_PATCH,
            trust_remote_code=True,
        )
    )
    patch = next(s for s in result.steps if s.name == "patch")
    assert patch.status == "not-needed"
    assert "--trust-remote-code" in patch.note
    assert result.remote_code == "the folder's own code is allowed (--trust-remote-code)"


def _perturb_weights(path):
    """Same size, still a valid safetensors file, different weights."""
    data = bytearray(path.read_bytes())
    data[-64:] = bytes(b ^ 0x01 for b in data[-64:])
    path.write_bytes(bytes(data))


def test_swapped_weights_are_not_reused(tmp_path, model_copy):
    """The fingerprint used to hash config.json only: a swapped checkpoint reused the smoke."""
    pytest.importorskip("transformers")
    work = tmp_path / "work"
    base = {
        "work_dir": work,
        "model_path": str(model_copy),
        "skip": ("download", "bench"),
        "device": "cpu",
        "dtype": "float32",
        "prompt": "And it came to pass",
    }
    run(_config(**base))
    assert _statuses(work)["smoke"] == "ok"
    weights = model_copy / "model.safetensors"
    size = weights.stat().st_size
    _perturb_weights(weights)
    assert weights.stat().st_size == size
    again = run(_config(**base))
    statuses = {s.name: s.status for s in again.steps}
    assert statuses["patch"] == "not-needed"  # re-ran: its source changed
    assert statuses["smoke"] == "ok"  # measured again, not "reused"


def test_deleted_weights_are_not_reused(tmp_path, model_copy):
    pytest.importorskip("transformers")
    work = tmp_path / "work"
    base = {
        "work_dir": work,
        "model_path": str(model_copy),
        "skip": ("download", "bench"),
        "device": "cpu",
        "dtype": "float32",
        "prompt": "And it came to pass",
    }
    run(_config(**base))
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(StepFailedError, match="step 'smoke' failed") as info:
        run(_config(**base))
    assert info.value.exit_code == EXIT.SMOKE_FAILED
    assert info.value.cause is not None
    assert info.value.cause["tool"] == "pypto-bench"
    assert info.value.cause["name"] == "LOAD_FAILED"
    recorded = json.loads((work / MANIFEST_NAME).read_text())["steps"]["smoke"]["error"]
    assert recorded["name"] == "SMOKE_FAILED"
    assert recorded["cause"]["name"] == "LOAD_FAILED"


def test_demo_preset_is_a_valid_pypto_patch_preset():
    from pypto_patch import Preset, get_preset

    assert Preset.from_dict(PRESET).family == "pypto_demo"
    assert get_preset("pypto_demo").auto_map == PRESET["auto_map"]  # found by entry point


def test_embedded_demo_model_passes_the_smoke_gate_honestly(model_copy):
    """Trained weights: readable greedy text, not a stub (random weights fail this gate)."""
    pytest.importorskip("transformers")
    from pypto_bench import smoke

    result = smoke(model_copy, device="cpu", prompt="And it came to pass", max_new_tokens=16)
    assert result.passed, result.reason
    assert result.coherence is not None
    assert result.coherence >= 0.5
    assert len(result.text.split()) >= 4


def test_the_report_compares_graph_with_the_hf_compile_recipe():
    import torch

    from pypto_bench import BenchConfig
    from pypto_bench.report import ArmResult, new_report
    from pypto_e2e.report import render_markdown

    config = _config(work_dir="w", model_id="a/b", arms=("eager", "graph", "hf-compile"))
    report = new_report(BenchConfig(), device=torch.device("cpu"), device_name="cpu")
    for name, best in (("eager", 10.0), ("graph", 30.0), ("hf-compile", 20.0)):
        arm = ArmResult(name=name)
        arm.tokens_per_s["best"] = best
        report.arms.append(arm)
    report.finish()
    text = render_markdown(report.to_dict(), None, config)
    assert (
        "graph vs hf-compile (transformers' static cache + torch.compile, same run): 1.500x" in text
    )
    assert "| 1.50 |" in text  # the bench table's x hf-compile column for the graph arm
