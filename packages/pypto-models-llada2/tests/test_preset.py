"""The ``llada2_moe`` preset: registered, placed by pypto-patch, loads the pinned folder."""

import json
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


@pytest.mark.parametrize("layers", [10**9, 0, 2.5])
def test_pypto_patch_apply_refuses_a_layer_count_no_checkpoint_has(tiny_dir, tmp_path, layers):
    """Issue #43 (second pass, M7): ``pypto-patch apply`` pinned a config declaring 1e9
    layers and exited 0; the load then built layers until memory ran out. The preset's
    check refuses it before a byte is written, and the config class again at load."""
    pypto_patch = pytest.importorskip("pypto_patch")
    from pypto_models_llada2 import LLaDA2ConfigError, LLaDA2MoeConfig
    from pypto_testing.folders import folder_bytes

    folder = tmp_path / "LLaDA2.0-mini"
    shutil.copytree(tiny_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (folder / "config.json").write_text(json.dumps(cfg))
    before = folder_bytes(folder)
    proc = subprocess.run(
        [sys.executable, "-m", "pypto_patch", "apply", "--model-path", str(folder),
         "--model-family", "llada2_moe"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == pypto_patch.EXIT.USAGE, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert f"num_hidden_layers is {layers!r}, not an integer in 1..1024" in lines[0]
    assert folder_bytes(folder) == before
    cfg.pop("auto_map", None)
    with pytest.raises(LLaDA2ConfigError, match="num_hidden_layers"):
        LLaDA2MoeConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
