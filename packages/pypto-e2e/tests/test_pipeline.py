"""pypto-e2e's own logic without the network: validation, reuse and re-run decisions,
the demo preset and the embedded demo model (the integration tests run the whole flow)."""

from __future__ import annotations

import json
import shutil

import pytest

from pypto_e2e import MANIFEST_NAME, BadRunInputError, RunConfig, StepFailedError, run
from pypto_e2e.demo import demo_model_dir
from pypto_e2e.demo_preset import PRESET


@pytest.fixture
def model_copy(tmp_path):
    dest = tmp_path / "model"
    shutil.copytree(demo_model_dir(), dest)
    return dest


def _statuses(work):
    steps = json.loads((work / MANIFEST_NAME).read_text())["steps"]
    return {k: v["status"] for k, v in steps.items()}


@pytest.mark.parametrize(
    ("kwargs", "message"),
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
    ],
)
def test_bad_requests_fail_before_anything_is_written(tmp_path, kwargs, message):
    work = tmp_path / "work"
    with pytest.raises(BadRunInputError, match=message):
        run(RunConfig(work_dir=work, **kwargs))
    assert not work.exists()


def test_fuse_adds_the_fused_arm_to_the_same_run():
    config = RunConfig(work_dir="w", model_id="a/b", arms=("eager",), fuse=True)
    assert config.effective_arms == ("eager", "graph", "pypto+graph")


def test_patch_only_run_is_reused_then_rerun_when_forced(tmp_path, model_copy):
    work = tmp_path / "work"
    base = {"work_dir": work, "model_path": str(model_copy), "skip": ("download", "smoke", "bench")}
    first = run(RunConfig(family="pypto_demo", **base))
    assert _statuses(work) == {
        "download": "skipped",
        "patch": "ok",
        "smoke": "skipped",
        "bench": "skipped",
        "report": "not-needed",
    }
    patched = work / "patched"
    assert first.model_path == patched
    auto_map = json.loads((patched / "config.json").read_text())["auto_map"]
    assert auto_map == PRESET["auto_map"]
    assert "auto_map" not in json.loads((model_copy / "config.json").read_text())  # overlay

    again = run(RunConfig(family="pypto_demo", **base))
    assert [s.status for s in again.steps if s.name == "patch"] == ["reused"]
    forced = run(RunConfig(family="pypto_demo", from_step="patch", **base))
    assert [s.status for s in forced.steps if s.name == "patch"] == ["ok"]


def test_a_native_model_needs_no_pinning(tmp_path, model_copy):
    work = tmp_path / "work"
    result = run(
        RunConfig(work_dir=work, model_path=str(model_copy), skip=("download", "smoke", "bench"))
    )
    patch = next(s for s in result.steps if s.name == "patch")
    assert patch.status == "not-needed"
    assert "no auto_map" in patch.note
    assert result.model_path == model_copy.resolve()


def test_remote_code_without_preset_names_the_flags(tmp_path, model_copy):
    cfg = json.loads((model_copy / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_remote.Remote"}
    (model_copy / "config.json").write_text(json.dumps(cfg))
    work = tmp_path / "work"
    with pytest.raises(StepFailedError, match="step 'patch' failed") as info:
        run(RunConfig(work_dir=work, model_path=str(model_copy), skip=("download",)))
    assert "--family" in str(info.value)
    assert _statuses(work)["patch"] == "failed"


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
