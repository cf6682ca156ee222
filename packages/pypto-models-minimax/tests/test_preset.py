"""The presets: registered, well formed, and what a pinned folder loads."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2ForCausalLM
from transformers.models.minimax_m3_vl.modeling_minimax_m3_vl import MiniMaxM3VLForCausalLM

import pypto_models_minimax
from pypto_models_minimax import MiniMaxConfigError
from pypto_models_minimax.configuration import PyptoMiniMaxM3Config, PyptoMiniMaxM27Config
from pypto_models_minimax.modeling import PyptoMiniMaxM3ForCausalLM, PyptoMiniMaxM27ForCausalLM
from pypto_models_minimax.preset import PRESETS
from pypto_patch import EXIT

SRC = Path(pypto_models_minimax.__file__).resolve().parent


def test_both_presets_are_entry_points_with_one_line_descriptions():
    eps = {ep.name: ep for ep in entry_points(group="pypto.model_families")}
    for family in ("minimax_m27", "minimax_m3"):
        preset = eps[family].load()
        assert preset is PRESETS[family]
        assert preset["family"] == family
        assert preset["description"]
        assert "\n" not in preset["description"]
        assert set(preset["auto_map"]) == {"AutoConfig", "AutoModelForCausalLM"}
        for target in preset["auto_map"].values():
            assert target.split(".")[0] + ".py" in preset["files"]


def test_presets_pass_pypto_patch_validation():
    presets = pytest.importorskip("pypto_patch.presets")
    for family, data in PRESETS.items():
        assert presets.Preset.from_dict(data, expected_family=family).family == family


def test_preset_listing_needs_no_torch():
    """pypto-patch imports the package to list presets: the import is standard library."""
    for name in ("__init__.py", "preset.py", "errors.py", "checks.py"):
        tree = ast.parse((SRC / name).read_text())
        top = {
            (n.module or "").split(".")[0]
            if isinstance(n, ast.ImportFrom)
            else a.name.split(".")[0]
            for n in tree.body
            if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in (n.names if isinstance(n, ast.Import) else [n])
            if not (isinstance(n, ast.ImportFrom) and n.level)
        }
        assert top <= {"__future__", "typing", "importlib"}, (name, top)


def test_library_code_imports_no_test_helpers():
    for path in SRC.rglob("*.py"):
        assert "pypto_testing" not in path.read_text(), path.name


@pytest.mark.parametrize(
    ("fixture", "family", "config_cls", "model_cls", "native"),
    [
        ("m27_bf16", "minimax_m27", PyptoMiniMaxM27Config, PyptoMiniMaxM27ForCausalLM, MiniMaxM2ForCausalLM),
        ("m3", "minimax_m3", PyptoMiniMaxM3Config, PyptoMiniMaxM3ForCausalLM, MiniMaxM3VLForCausalLM),
    ],
)  # fmt: skip
def test_a_pinned_folder_loads_this_package_s_classes(
    request, pinned, fixture, family, config_cls, model_cls, native
):
    folder = pinned(request.getfixturevalue(fixture), family)
    cfg = AutoConfig.from_pretrained(folder, trust_remote_code=True, local_files_only=True)
    assert type(cfg) is config_cls
    model = AutoModelForCausalLM.from_pretrained(
        folder, trust_remote_code=True, local_files_only=True
    )
    assert type(model) is model_cls
    assert isinstance(model, native)
    assert model.pypto_model_family == family


def test_the_m3_config_is_the_vl_checkpoint_s_text_part(m3):
    cfg = PyptoMiniMaxM3Config.from_pretrained(m3)
    raw = json.loads((m3 / "config.json").read_text())
    assert raw["model_type"] == "minimax_m3_vl"
    assert cfg.num_hidden_layers == raw["text_config"]["num_hidden_layers"]
    assert cfg.layer_types == ["full_attention", "minimax_m3_sparse", "minimax_m3_sparse"]
    assert cfg.mlp_layer_types == ["dense", "sparse", "sparse"]
    assert cfg.index_block_size == 4
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.5


@pytest.mark.parametrize(
    ("fixture", "family", "needle"),
    [
        ("m3", "minimax_m27", "pin it with the minimax_m3 preset"),
        ("m27_bf16", "minimax_m3", "pin it with the minimax_m27 preset"),
    ],
)
def test_a_folder_pinned_with_the_wrong_preset_fails_in_one_line(
    request, copy_of, snapshot, fixture, family, needle
):
    """The preset's check refuses the pin before a byte is written; the pinned config class
    refuses the same dict at load (a folder whose config.json was replaced after the pin)."""
    from pypto_patch import apply
    from pypto_patch.errors import PresetMismatchError

    folder = copy_of(request.getfixturevalue(fixture))
    before = snapshot(folder)
    with pytest.raises(PresetMismatchError) as refused:
        apply(folder, family=family)
    assert needle in str(refused.value)
    assert "\n" not in str(refused.value)
    assert snapshot(folder) == before
    config_class = PyptoMiniMaxM27Config if family == "minimax_m27" else PyptoMiniMaxM3Config
    with pytest.raises(MiniMaxConfigError) as info:
        config_class.from_dict(json.loads((folder / "config.json").read_text()))
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("family", "layers"),
    [("minimax_m27", 10**9), ("minimax_m27", 0), ("minimax_m3", 10**9), ("minimax_m3", "2")],
)
def test_pypto_patch_apply_refuses_a_layer_count_no_checkpoint_has(
    family, layers, m27_bf16, m3, copy_of, snapshot
):
    """Issue #43 (second pass, M7): ``pypto-patch apply`` pinned a config declaring 1e9
    layers and exited 0; the load then built layers until memory ran out. The preset's
    check refuses it before a byte is written, and the config class again at load."""
    folder = copy_of(m27_bf16 if family == "minimax_m27" else m3)
    cfg = json.loads((folder / "config.json").read_text())
    target = cfg.get("text_config", cfg)
    target["num_hidden_layers"] = layers
    (folder / "config.json").write_text(json.dumps(cfg))
    before = snapshot(folder)
    proc = subprocess.run(
        [sys.executable, "-m", "pypto_patch", "apply", "--model-path", str(folder),
         "--model-family", family],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == EXIT.USAGE, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert f"num_hidden_layers is {layers!r}, not an integer in 1..1024" in lines[0]
    assert snapshot(folder) == before
    with pytest.raises(MiniMaxConfigError, match="num_hidden_layers"):
        (PyptoMiniMaxM27Config if family == "minimax_m27" else PyptoMiniMaxM3Config).from_dict(cfg)
