"""The ``llada2_moe`` preset: registered, placed by pypto-patch, loads the pinned folder."""

import shutil
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from pypto_models_llada2.preset import PRESET
from pypto_testing.llada2 import AUTO_MAP


def test_preset_is_registered_with_the_checkpoint_class_names():
    eps = [ep for ep in entry_points(group="pypto.model_families") if ep.name == "llada2_moe"]
    assert len(eps) == 1
    assert eps[0].load() is PRESET
    assert PRESET["family"] == "llada2_moe"
    assert PRESET["description"]
    assert "\n" not in PRESET["description"]
    assert PRESET["auto_map"] == AUTO_MAP  # the names the published checkpoints' auto_map uses
    for target in PRESET["auto_map"].values():
        assert target.split(".")[0] + ".py" in PRESET["files"]


def test_pypto_patch_lists_the_preset():
    pypto_patch = pytest.importorskip("pypto_patch")
    preset = pypto_patch.get_preset("llada2_moe")
    assert dict(preset.auto_map) == AUTO_MAP


def test_the_published_remote_code_fails_and_the_pinned_folder_loads(
    tiny_dir, tmp_path, checkpoint_tensors
):
    """Without the pin, trust_remote_code runs the checkpoint's code, which no longer
    imports on transformers 5.x; after ``pypto-patch apply`` the same folder loads through
    the placed shims (in a fresh interpreter that has not imported this package)."""
    pypto_patch = pytest.importorskip("pypto_patch")
    folder = tmp_path / "LLaDA2.0-mini"
    shutil.copytree(tiny_dir, folder)
    env_code = (
        "import sys, transformers\n"
        "from transformers import AutoModelForCausalLM\n"
        "try:\n"
        "    m = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True, local_files_only=True)\n"
        "except Exception as err:\n"
        "    print('FAILED', type(err).__name__, str(err).splitlines()[0][:200])\n"
        "else:\n"
        "    w = m.model.layers[1].mlp.experts.gate_up_proj\n"
        "    print('LOADED', type(m).__name__, type(m).__module__, float(w.double().sum()))\n"
    )

    def load() -> str:
        proc = subprocess.run(
            [sys.executable, "-c", env_code, str(folder)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]

    before = load()
    # Why it fails depends on the transformers version (5.24: modeling_attn_mask_utils is
    # gone; 5.8 already stops at the configuration module); that it fails does not.
    assert before.startswith("FAILED"), before
    result = pypto_patch.apply(str(folder), family="llada2_moe")
    assert result.action == "applied"
    pypto_patch.verify_pinned(str(folder))
    after = load()
    assert after.startswith("LOADED LLaDA2MoeModelLM")
    assert "pypto_models_llada2" in after
    expected = sum(
        float(checkpoint_tensors[f"model.layers.1.mlp.experts.{e}.{n}_proj.weight"].double().sum())
        for e in range(16)
        for n in ("gate", "up")
    )
    assert float(after.split()[-1]) == pytest.approx(expected, rel=1e-9)  # the checkpoint's experts
