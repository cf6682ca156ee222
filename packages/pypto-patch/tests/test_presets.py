"""Preset discovery through the entry-point group and the validation rules."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

import pypto_patch as pp
from pypto_patch import (
    EXIT,
    Preset,
    PresetInvalidError,
    UnknownFamilyError,
    apply,
    discover_presets,
    get_preset,
    list_presets,
)

GOOD = {
    "family": "fam",
    "version": "1.0",
    "description": "d",
    "auto_map": {
        "AutoConfig": "configuration_fam.FamConfig",
        "AutoModelForCausalLM": "modeling_fam.FamForCausalLM",
    },
    "files": {"configuration_fam.py": "x = 1\n", "modeling_fam.py": "y = 2\n"},
}


def test_installed_family_package_is_discovered():
    found = discover_presets()
    assert found.errors == {}
    assert {"tinytest", "tinytest_alt"} <= set(found.presets)
    p = found.presets["tinytest"]
    assert p.distribution == "pypto-models-tinytest"
    assert p.distribution_version == "0.1.0"
    assert p.version == "0.1.0"
    # the callable form is called and validated like the dict form
    alt = found.presets["tinytest_alt"]
    assert alt.version == "0.2.0"
    assert "extras/notes.txt" in alt.files
    assert [q.family for q in list_presets()] == sorted(found.presets)


def test_unknown_family_lists_known_ones():
    with pytest.raises(UnknownFamilyError) as ei:
        get_preset("nope")
    assert "tinytest" in str(ei.value)
    assert "tinytest_alt" in str(ei.value)
    assert ei.value.exit_code == pp.EXIT.UNKNOWN_FAMILY


def _mutate(path: str, value):
    d = copy.deepcopy(GOOD)
    keys = path.split(".", 1)
    if len(keys) == 1:
        if value is KeyError:
            del d[keys[0]]
        else:
            d[keys[0]] = value
    else:
        if value is KeyError:
            del d[keys[0]][keys[1]]
        else:
            d[keys[0]][keys[1]] = value
    return d


BAD = {
    "not a dict": ["family", "version"],
    "unknown key": {**GOOD, "extra": 1},
    "missing files": _mutate("files", KeyError),
    "bad family": _mutate("family", "../x"),
    "empty version": _mutate("version", ""),
    "no AutoConfig": _mutate("auto_map.AutoConfig", KeyError),
    "bad class ref": _mutate("auto_map.AutoModelForCausalLM", "modeling_fam"),
    "nested class ref": _mutate("auto_map.AutoModelForCausalLM", "a.b.C"),
    "remote repo ref": _mutate("auto_map.AutoModelForCausalLM", "org/repo--modeling_fam.X"),
    "bad auto key": _mutate("auto_map.ModelForCausalLM", "modeling_fam.X"),
    "image-text only": {
        **GOOD,
        "auto_map": {
            "AutoConfig": "configuration_fam.C",
            "AutoModelForImageTextToText": "modeling_fam.M",
        },
    },
    "module not placed": _mutate("auto_map.AutoModelForCausalLM", "modeling_other.X"),
    "escaping file": _mutate("files.../evil.py", "x"),
    "absolute file": _mutate("files./etc/evil.py", "x"),
    "config.json as file": _mutate("files.config.json", "{}"),
    "backup name as file": _mutate("files.x.pypto_orig", "x"),
    "non-text content": _mutate("files.modeling_fam.py", 3),
    "tokenizer_config.json as file": _mutate("files.tokenizer_config.json", "{}"),
    "processor_config.json as file": _mutate("files.processor_config.json", "{}"),
    "overlay marker as file": _mutate("files..pypto_patch.overlay.json", "{}"),
    # a shim importing a module the preset does not place would run the repo's copy
    "relative import not placed": _mutate("files.modeling_fam.py", "from .helper import X\n"),
    "relative import upwards": _mutate("files.modeling_fam.py", "from ..evil import X\n"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_preset_gives_one_line_error_naming_origin(case):
    with pytest.raises(PresetInvalidError) as ei:
        Preset.from_dict(BAD[case], origin="package pypto-models-fam")
    msg = str(ei.value)
    assert "\n" not in msg
    assert "pypto-models-fam" in msg
    assert ei.value.exit_code == pp.EXIT.PRESET_INVALID


def test_relative_import_of_a_placed_module_is_allowed():
    data = copy.deepcopy(GOOD)
    data["files"]["modeling_fam.py"] = "from .helper_fam import X\n"
    data["files"]["helper_fam.py"] = "X = 1\n"
    assert "helper_fam.py" in Preset.from_dict(data).files


def test_good_preset_and_fingerprint_tracks_content():
    a = Preset.from_dict(GOOD)
    b = Preset.from_dict(_mutate("files.modeling_fam.py", "y = 3\n"))
    assert a.fingerprint == Preset.from_dict(copy.deepcopy(GOOD)).fingerprint
    assert a.fingerprint != b.fingerprint
    assert a.files["modeling_fam.py"] == b"y = 2\n"


def test_entry_point_family_must_match_and_broken_packages_do_not_hide_others(
    tmp_path, monkeypatch, hf_folder
):
    site = tmp_path / "site2"
    (site / "broken_pkg").mkdir(parents=True)
    (site / "broken_pkg" / "__init__.py").write_text(
        "GOOD = " + json.dumps(GOOD) + "\nWRONG = dict(GOOD, family='other')\n"
    )
    (site / "broken_pkg" / "boom.py").write_text("raise ImportError('needs torch_npu')\n")
    info = site / "pypto_models_broken-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: pypto-models-broken\nVersion: 9.9\n"
    )
    (info / "entry_points.txt").write_text(
        "[pypto.model_families]\nfam = broken_pkg:GOOD\nmismatch = broken_pkg:WRONG\nboom = broken_pkg.boom:PRESET\n"
    )
    monkeypatch.syspath_prepend(str(site))
    found = discover_presets()
    assert "fam" in found.presets
    assert "tinytest" in found.presets
    assert "mismatch" in found.errors
    assert "entry point is named 'mismatch'" in found.errors["mismatch"]
    assert "boom" in found.errors
    assert "pypto-models-broken" in found.errors["boom"]
    assert "ImportError" in found.errors["boom"]
    before = sorted(p.name for p in hf_folder.iterdir())
    with pytest.raises(PresetInvalidError, match="pypto-models-broken"):
        apply(hf_folder, family="boom")
    assert sorted(p.name for p in hf_folder.iterdir()) == before
    sys.modules.pop("broken_pkg", None)


def test_preset_passed_in_code(hf_folder: Path):
    res = apply(hf_folder, preset=GOOD)
    assert res.family == "fam"
    assert (hf_folder / "modeling_fam.py").read_text() == "y = 2\n"


def _only_gemma4(config):
    if config.get("model_type") != "gemma4":
        raise ValueError(
            f"model_type {config.get('model_type')!r} is not gemma4; use another preset"
        )


@pytest.mark.parametrize("overlay", [False, True])
def test_a_preset_check_refuses_a_folder_before_anything_is_written(
    hf_folder, tmp_path, snap, overlay
):
    from pypto_patch import PresetMismatchError

    config = json.loads((hf_folder / "config.json").read_text())
    assert config.get("model_type") != "gemma4"
    before = snap(hf_folder)
    out = tmp_path / "overlay" if overlay else None
    with pytest.raises(PresetMismatchError, match="does not fit preset 'fam'") as info:
        apply(hf_folder, preset={**GOOD, "check": _only_gemma4}, output_dir=out)
    assert "\n" not in str(info.value)
    assert info.value.exit_code == EXIT.USAGE
    assert snap(hf_folder) == before
    assert out is None or not out.exists()


def test_a_preset_check_that_passes_lets_the_pin_happen(hf_folder):
    seen = []
    res = apply(hf_folder, preset={**GOOD, "check": seen.append})
    assert res.family == "fam"
    assert seen
    assert (
        seen[0]["model_type"]
        == json.loads((hf_folder / "config.json.pypto_orig").read_text())["model_type"]
    )


def test_a_check_that_is_not_callable_is_an_invalid_preset(hf_folder):
    with pytest.raises(PresetInvalidError, match="'check' must be a callable"):
        apply(hf_folder, preset={**GOOD, "check": "nope"})
