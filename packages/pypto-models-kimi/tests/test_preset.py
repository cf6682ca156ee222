"""The preset: registered, well formed, what a pinned folder loads, and that the folder's
own Python never runs."""

from __future__ import annotations

import ast
import json
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearForCausalLM

import pypto_models_kimi
from pypto_models_kimi.checks import PRESET_AUTO_MAP
from pypto_models_kimi.configuration import PyptoKimiLinearConfig
from pypto_models_kimi.modeling import PyptoKimiLinearForCausalLM
from pypto_models_kimi.preset import PRESETS
from pypto_testing.kimi import SHIPPED_CODE_FILES, SHIPPED_CODE_MARKER

SRC = Path(pypto_models_kimi.__file__).resolve().parent
FAMILY = "kimi_linear_48b_a3b"


def test_the_preset_is_an_entry_point_with_a_one_line_description():
    eps = {ep.name: ep for ep in entry_points(group="pypto.model_families")}
    preset = eps[FAMILY].load()
    assert preset is PRESETS[FAMILY]
    assert preset["family"] == FAMILY
    assert preset["version"] == pypto_models_kimi.__version__
    assert preset["description"]
    assert "\n" not in preset["description"]
    assert preset["auto_map"] == PRESET_AUTO_MAP
    assert set(preset["auto_map"]) == {"AutoConfig", "AutoModelForCausalLM"}
    for target in preset["auto_map"].values():
        assert target.split(".")[0] + ".py" in preset["files"]


def test_the_preset_passes_pypto_patch_validation_and_is_listed():
    from pypto_patch.presets import Preset, get_preset

    assert Preset.from_dict(PRESETS[FAMILY], expected_family=FAMILY).family == FAMILY
    assert get_preset(FAMILY).check is not None


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
        assert top <= {"__future__", "typing", "importlib", "re", "collections"}, (name, top)


def test_library_code_imports_no_test_helpers():
    for path in SRC.rglob("*.py"):
        assert "pypto_testing" not in path.read_text(), path.name


def test_every_module_declares_all():
    for path in SRC.glob("*.py"):
        assert "__all__" in path.read_text(), path.name
    assert (SRC / "py.typed").is_file()


def test_the_unpinned_folder_would_run_its_shipped_code(kimi):
    """Guard for the tests below: the tiny folder's own Python really raises when run."""
    with pytest.raises(RuntimeError, match=SHIPPED_CODE_MARKER):
        AutoConfig.from_pretrained(kimi[0], trust_remote_code=True, local_files_only=True)


def test_pinning_points_every_auto_map_at_the_preset(pinned):
    from pypto_patch import verify_pinned

    cfg = json.loads((pinned / "config.json").read_text())
    assert cfg["auto_map"] == PRESET_AUTO_MAP  # the repo's AutoModel entry is gone
    tok_cfg = json.loads((pinned / "tokenizer_config.json").read_text())
    assert "auto_map" not in tok_cfg or not tok_cfg["auto_map"]
    verify_pinned(pinned)
    for name in SHIPPED_CODE_FILES:  # still in the folder, just never imported
        assert (pinned / name).is_file()


def test_a_pinned_folder_loads_this_package_s_classes_and_never_the_shipped_code(pinned):
    cfg = AutoConfig.from_pretrained(pinned, trust_remote_code=True, local_files_only=True)
    assert type(cfg) is PyptoKimiLinearConfig
    model = AutoModelForCausalLM.from_pretrained(
        pinned, trust_remote_code=True, local_files_only=True, dtype="float32"
    )
    assert type(model) is PyptoKimiLinearForCausalLM
    assert isinstance(model, KimiLinearForCausalLM)
    assert model.pypto_model_family == FAMILY
    assert model.pypto_load_report is not None
    tok = AutoTokenizer.from_pretrained(pinned, trust_remote_code=True, local_files_only=True)
    assert tok.decode(tok("kimi linear")["input_ids"]) == "kimi linear"


def test_a_folder_of_another_family_is_refused_before_anything_is_written(tmp_path, snapshot):
    from pypto_patch import PresetMismatchError, apply
    from pypto_testing.models import make_tiny_model

    folder = make_tiny_model(tmp_path / "llama", "llama")
    before = snapshot(folder)
    with pytest.raises(PresetMismatchError) as info:
        apply(folder, family=FAMILY)
    message = str(info.value)
    assert "model_type 'llama', not 'kimi_linear'" in message
    assert "\n" not in message
    assert snapshot(folder) == before


def test_a_pinned_folder_loaded_without_trust_says_the_pin_did_not_run(pinned, caplog):
    """Issue #43, item 17: without --trust-remote-code transformers builds its own Kimi
    class for the registered model type, so the preset's code and checks never ran, and
    nothing said so. The bench's loader says it (a log warning, and in the report)."""
    bench_loading = pytest.importorskip("pypto_bench.loading")
    import logging

    with caplog.at_level(logging.WARNING, logger="pypto_bench.loading"):
        loaded = bench_loading.load_model(pinned, device="cpu", dtype="float32")
    assert type(loaded.model) is KimiLinearForCausalLM  # the native class, not the pin
    said = [r.getMessage() for r in caplog.records if "auto_map" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "rerun with --trust-remote-code to run the pin" in said[0]
    assert "PyptoKimiLinearForCausalLM" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pypto_bench.loading"):
        trusted = bench_loading.load_model(
            pinned, device="cpu", dtype="float32", trust_remote_code=True
        )
    assert type(trusted.model) is PyptoKimiLinearForCausalLM
    assert not [r for r in caplog.records if "auto_map" in r.getMessage()]


def test_a_bad_pinned_config_run_without_trust_names_the_fallback(pinned, tmp_path):
    """The reproduction: `linear_attn_config.num_heads: 0` in a pinned folder, benched
    without --trust-remote-code, failed deep in torch ("groups must be a positive
    integer") with no word that the preset's checks had been bypassed."""
    import os
    import subprocess
    import sys

    pytest.importorskip("pypto_bench")
    cfg = json.loads((pinned / "config.json").read_text())
    cfg["linear_attn_config"]["num_heads"] = 0
    (pinned / "config.json").write_text(json.dumps(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "pypto_bench", "run", "--model-path", str(pinned),
         "--device", "cpu", "--arms", "eager", "--warmup", "0", "--iters", "1",
         "--seq", "4", "--gen", "2", "--no-bandwidth", "--no-progress"],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert "loaded without --trust-remote-code" in proc.stderr, proc.stderr[-3000:]
    assert "rerun with --trust-remote-code to run the pin" in proc.stderr
    # with it, the preset's own check refuses the config in one line, before torch
    trusted = subprocess.run(
        [sys.executable, "-m", "pypto_bench", "run", "--model-path", str(pinned),
         "--trust-remote-code", "--device", "cpu", "--arms", "eager", "--warmup", "0",
         "--iters", "1", "--seq", "4", "--gen", "2", "--no-bandwidth", "--no-progress"],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert trusted.returncode != 0
    assert "groups must be a positive integer" not in trusted.stderr, trusted.stderr[-3000:]
    assert "num_heads" in trusted.stderr, trusted.stderr[-3000:]
