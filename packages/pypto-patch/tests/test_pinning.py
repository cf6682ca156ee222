"""The pinned view reaches only the preset's code: every auto_map entry the preset does
not cover is removed (and listed) in every file transformers reads one from, as are
``custom_pipelines`` and ``custom_generate/generate.py``; ``verify_pinned`` proves it
before a loader turns on ``trust_remote_code``. Torch-free; the transformers load is in
test_transformers.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pypto_patch as pp
from pypto_patch import NotPatchedError, NotPinnedError, UnsafeBookkeepingError
from pypto_patch.pinning import auto_map_entries, auto_map_sites

TINY_MAP = {
    "AutoConfig": "configuration_tinytest.TinyTestConfig",
    "AutoModelForCausalLM": "modeling_tinytest.TinyTestForCausalLM",
    "AutoModelForImageTextToText": "modeling_tinytest.TinyTestForCausalLM",
}

#: file -> what a hostile repo ships in it (on top of write_hf_folder's config.json).
HOSTILE_JSON = {
    "tokenizer_config.json": {
        "model_max_length": 16,
        "auto_map": {
            "AutoTokenizer": ["tokenization_evil.EvilTokenizer", "tokenization_evil.EvilFast"],
            "AutoProcessor": "processing_evil.EvilProcessor",
        },
    },
    "processor_config.json": {
        "processor_class": "EvilProcessor",
        "auto_map": {"AutoProcessor": "processing_evil.EvilProcessor"},
        "image_processor": {"auto_map": {"AutoImageProcessor": {"pil": "image_evil.EvilImage"}}},
    },
    "preprocessor_config.json": {
        "auto_map": {
            "AutoImageProcessor": "other/repo--image_evil.EvilImage",
            "AutoFeatureExtractor": "fe_evil.EvilFE",
        }
    },
    "video_preprocessor_config.json": {"auto_map": {"AutoVideoProcessor": "video_evil.EvilVideo"}},
    "audio_tokenizer_config.json": {"auto_map": {"AutoModel": "audio_evil.EvilAudio"}},
}

EXPECTED_REMOVED = {
    ("config.json", "auto_map", "AutoTokenizer"),
    ("config.json", "auto_map", "AutoModel"),
    ("config.json", "text_config/auto_map", "AutoTokenizer"),
    ("config.json", "custom_pipelines", "evil-task"),
    ("tokenizer_config.json", "auto_map", "AutoTokenizer"),
    ("tokenizer_config.json", "auto_map", "AutoProcessor"),
    ("processor_config.json", "auto_map", "AutoProcessor"),
    ("processor_config.json", "image_processor/auto_map", "AutoImageProcessor"),
    ("preprocessor_config.json", "auto_map", "AutoImageProcessor"),
    ("preprocessor_config.json", "auto_map", "AutoFeatureExtractor"),
    ("video_preprocessor_config.json", "auto_map", "AutoVideoProcessor"),
    ("audio_tokenizer_config.json", "auto_map", "AutoModel"),
}


def _hostile_folder(make_folder, path: Path) -> Path:
    folder = make_folder(path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"]["AutoModel"] = "other/repo--modeling_evil.EvilModel"  # cross-repo reference
    cfg["text_config"] = {"auto_map": {"AutoTokenizer": "tokenization_evil.EvilTokenizer"}}
    cfg["custom_pipelines"] = {"evil-task": {"impl": "pipe_evil.EvilPipeline", "pt": ["AutoModel"]}}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    for name, doc in HOSTILE_JSON.items():
        (folder / name).write_text(json.dumps(doc, indent=4))
    (folder / "custom_generate").mkdir()
    (folder / "custom_generate" / "generate.py").write_text("raise SystemExit('evil')\n")
    (folder / "custom_generate" / "requirements.txt").write_text("numpy\n")
    return folder


@pytest.fixture
def hostile_folder(tmp_path: Path, make_folder) -> Path:
    return _hostile_folder(make_folder, tmp_path / "models" / "hostile")


def _assert_pinned_view(view: Path, preset_map: dict) -> None:
    """Every auto_map anywhere holds only preset entries; no other remote-code hook is left."""
    for name in pp.AUTO_MAP_FILES:
        if not (view / name).is_file():
            continue
        doc = json.loads((view / name).read_text())
        for parent, loc in auto_map_sites(doc):
            for key, value in auto_map_entries(parent["auto_map"]):
                assert key in preset_map, (name, loc, key)
                assert value == preset_map[key], (name, loc, key)
        if name == "config.json":
            assert doc["auto_map"] == preset_map
            assert "custom_pipelines" not in doc
    assert not (view / "custom_generate" / "generate.py").exists()


def _removed(res) -> set[tuple[str, str, str]]:
    return {(r["file"], r["at"], r["key"]) for r in res.removed_auto_map}


def test_in_place_pin_removes_lists_and_restores_byte_identically(hostile_folder: Path, snap):
    before = snap(hostile_folder)
    res = pp.apply(hostile_folder, family="tinytest")
    assert _removed(res) == EXPECTED_REMOVED
    values = {(r["file"], r["at"], r["key"]): r["value"] for r in res.removed_auto_map}
    assert values[("tokenizer_config.json", "auto_map", "AutoTokenizer")] == [
        "tokenization_evil.EvilTokenizer",
        "tokenization_evil.EvilFast",
    ]
    _assert_pinned_view(hostile_folder, TINY_MAP)
    # every edited json and the removed module are backed up and recorded
    actions = {c.path: c.action for c in res.changes}
    for name in HOSTILE_JSON:
        assert actions[name] == "replaced"
        assert (hostile_folder / f"{name}.pypto_orig").is_file()
    assert actions["custom_generate/generate.py"] == "removed"
    assert (hostile_folder / "custom_generate" / "requirements.txt").is_file()
    # unrelated keys of the edited files are kept
    assert json.loads((hostile_folder / "tokenizer_config.json").read_text()) == {
        "model_max_length": 16
    }
    st = pp.status(hostile_folder)
    assert st.intact
    assert len(st.removed_auto_map) == len(EXPECTED_REMOVED)
    ver = pp.verify_pinned(hostile_folder)
    assert set(ver.modules) == {"configuration_tinytest.py", "modeling_tinytest.py"}
    assert set(HOSTILE_JSON) <= set(ver.files_checked)
    # same preset again: nothing to do
    assert pp.apply(hostile_folder, family="tinytest").action == "unchanged"
    pp.restore(hostile_folder)
    assert snap(hostile_folder) == before


def test_overlay_pin_removes_and_lists_leaving_the_source_alone(
    hostile_folder: Path, tmp_path: Path, snap
):
    before = snap(hostile_folder)
    out = tmp_path / "pinned"
    res = pp.apply(hostile_folder, family="tinytest", output_dir=out)
    assert _removed(res) == EXPECTED_REMOVED
    _assert_pinned_view(out, TINY_MAP)
    assert (out / "custom_generate").is_dir()
    assert not (out / "custom_generate").is_symlink()
    assert (out / "custom_generate" / "requirements.txt").is_symlink()
    assert snap(hostile_folder) == before
    assert set(pp.verify_pinned(out).modules) == {
        "configuration_tinytest.py",
        "modeling_tinytest.py",
    }
    assert pp.apply(hostile_folder, family="tinytest", output_dir=out).action == "unchanged"


def test_legacy_list_form_tokenizer_auto_map_is_removed(hf_folder: Path, snap):
    tok = {"auto_map": ["tokenization_evil.Slow", "tokenization_evil.Fast"], "x": 1}
    (hf_folder / "tokenizer_config.json").write_text(json.dumps(tok))
    before = snap(hf_folder)
    res = pp.apply(hf_folder, family="tinytest")
    assert ("tokenizer_config.json", "auto_map", "AutoTokenizer") in _removed(res)
    assert json.loads((hf_folder / "tokenizer_config.json").read_text()) == {"x": 1}
    pp.verify_pinned(hf_folder)
    pp.restore(hf_folder)
    assert snap(hf_folder) == before


def test_entries_the_preset_covers_point_at_the_preset(tmp_path: Path, make_folder, snap):
    """A preset that maps AutoTokenizer wins in tokenizer_config.json too (read first)."""
    folder = _hostile_folder(make_folder, tmp_path / "m")
    before = snap(folder)
    preset = {
        "family": "fam",
        "version": "1",
        "auto_map": {
            "AutoConfig": "configuration_fam.C",
            "AutoModelForCausalLM": "modeling_fam.M",
            "AutoTokenizer": [None, "tokenization_fam.T"],
        },
        "files": {
            "configuration_fam.py": "class C: pass\n",
            "modeling_fam.py": "class M: pass\n",
            "tokenization_fam.py": "class T: pass\n",
        },
    }
    res = pp.apply(folder, preset=preset)
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    assert tok["auto_map"] == {"AutoTokenizer": [None, "tokenization_fam.T"]}
    assert ("tokenizer_config.json", "auto_map", "AutoTokenizer") not in _removed(res)
    assert ("tokenizer_config.json", "auto_map", "AutoProcessor") in _removed(res)
    _assert_pinned_view(folder, preset["auto_map"])
    assert "tokenization_fam.py" in pp.verify_pinned(folder).modules
    pp.restore(folder)
    assert snap(folder) == before


def test_cli_lists_removed_entries_on_stderr_and_in_json(hostile_folder: Path, run_cli, tmp_path):
    p = run_cli(
        "apply", "--model-family", "tinytest", "--model-path", str(hostile_folder),
        "--output-dir", str(tmp_path / "o"),
    )  # fmt: skip
    assert p.returncode == pp.EXIT.OK, p.stderr
    assert p.stderr.count("  unpinned  ") == len(EXPECTED_REMOVED)
    assert 'tokenizer_config.json auto_map["AutoTokenizer"]' in p.stderr
    p = run_cli(
        "apply", "--model-family", "tinytest", "--model-path", str(hostile_folder), "--json"
    )
    assert p.returncode == pp.EXIT.OK, p.stderr
    doc = json.loads(p.stdout)
    assert {(r["file"], r["at"], r["key"]) for r in doc["removed_auto_map"]} == EXPECTED_REMOVED
    p = run_cli("verify", "--model-path", str(hostile_folder), "--json")
    assert p.returncode == pp.EXIT.OK, p.stderr
    assert "modeling_tinytest.py" in json.loads(p.stdout)["modules"]


# ---------------------------------------------------------------- verify_pinned refuses


def _edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text()) if path.exists() else {}
    change(doc)
    path.write_text(json.dumps(doc))


TAMPER = {
    "tokenizer entry added back": (
        lambda f: _edit_json(
            f / "tokenizer_config.json",
            lambda d: d.__setitem__("auto_map", {"AutoTokenizer": ["tokenization_evil.E", None]}),
        ),
        "tokenization_evil",
    ),
    "config entry added back": (
        lambda f: _edit_json(
            f / "config.json",
            lambda d: d["auto_map"].__setitem__("AutoTokenizer", "tokenization_remote.T"),
        ),
        "tokenization_remote",
    ),
    "cross-repo reference": (
        lambda f: _edit_json(
            f / "config.json",
            lambda d: d["auto_map"].__setitem__("AutoModel", "org/x--modeling_tinytest.M"),
        ),
        "another repository",
    ),
    "nested processor entry in a new file": (
        lambda f: _edit_json(
            f / "processor_config.json",
            lambda d: d.__setitem__(
                "image_processor", {"auto_map": {"AutoImageProcessor": "ev.I"}}
            ),
        ),
        "image_processor/auto_map",
    ),
    "custom pipeline added": (
        lambda f: _edit_json(
            f / "config.json",
            lambda d: d.__setitem__("custom_pipelines", {"t": {"impl": "pipe_evil.P"}}),
        ),
        "custom_pipelines",
    ),
    "shim bytes changed": (
        lambda f: (f / "modeling_tinytest.py").write_text("import os; os.system('evil')\n"),
        "changed since pypto-patch placed it",
    ),
    "shim imports a repo module": (
        lambda f: (f / "configuration_tinytest.py").write_text("from .modeling_remote import X\n"),
        "configuration_tinytest.py changed",
    ),
    "custom_generate put back": (
        lambda f: (f / "custom_generate" / "generate.py").write_text("evil = 1\n"),
        "custom_generate/generate.py",
    ),
}


@pytest.mark.parametrize("overlay", [False, True], ids=["in-place", "overlay"])
@pytest.mark.parametrize("case", sorted(TAMPER))
def test_verify_refuses_a_tampered_view(hostile_folder: Path, tmp_path: Path, case, overlay):
    out = tmp_path / "ov" if overlay else None
    res = pp.apply(hostile_folder, family="tinytest", output_dir=out)
    view = Path(res.model_path)
    pp.verify_pinned(view)
    tamper, needle = TAMPER[case]
    target = view
    if overlay and case == "custom_generate put back":
        target = hostile_folder  # the overlay links custom_generate/ children from the source
        (view / "custom_generate" / "generate.py").symlink_to(
            hostile_folder / "custom_generate" / "generate.py"
        )
    for name in ("config.json", "tokenizer_config.json"):
        if (view / name).is_symlink():  # write the overlay's own copy, not the source
            data = (view / name).read_bytes()
            (view / name).unlink()
            (view / name).write_bytes(data)
    tamper(target)
    with pytest.raises(NotPinnedError) as ei:
        pp.verify_pinned(view)
    assert needle in str(ei.value)
    assert ei.value.exit_code == pp.EXIT.NOT_PINNED
    assert "\n" not in str(ei.value)


def test_a_new_auto_map_file_makes_reapply_repin(hf_folder: Path):
    """An entry appearing after the pin (a file the pin never edited) is caught and re-pinned."""
    pp.apply(hf_folder, family="tinytest")
    (hf_folder / "processor_config.json").write_text(
        json.dumps({"auto_map": {"AutoProcessor": "processing_evil.P"}})
    )
    with pytest.raises(NotPinnedError):
        pp.verify_pinned(hf_folder)
    res = pp.apply(hf_folder, family="tinytest")
    assert res.action == "applied"
    assert ("processor_config.json", "auto_map", "AutoProcessor") in _removed(res)
    pp.verify_pinned(hf_folder)


def test_verify_on_unpinned_and_interrupted_folders(hf_folder: Path, run_cli):
    with pytest.raises(NotPatchedError):
        pp.verify_pinned(hf_folder)
    p = run_cli("verify", "--model-path", str(hf_folder))
    assert p.returncode == pp.EXIT.NOT_PATCHED
    p = run_cli(
        "--model-family", "tinytest", "--model-path", str(hf_folder),
        env={"PYPTO_PATCH_FAULT": "apply:manifest-written"},
    )  # fmt: skip
    assert p.returncode == pp.EXIT.FAULT_INJECTED
    with pytest.raises(NotPinnedError, match="interrupted"):
        pp.verify_pinned(hf_folder)
    p = run_cli("verify", "--model-path", str(hf_folder))
    assert p.returncode == pp.EXIT.NOT_PINNED
    assert len(p.stderr.strip().splitlines()) == 1


def test_verify_refuses_an_unbound_manifest(hf_folder: Path, tmp_path: Path):
    pp.apply(hf_folder, family="tinytest")
    m = json.loads((hf_folder / pp.MANIFEST_NAME).read_text())
    m["folder"]["ino"] += 1
    (hf_folder / pp.MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(UnsafeBookkeepingError):
        pp.verify_pinned(hf_folder)


def test_custom_mode_vouches_only_for_the_modules_named(hf_folder: Path, snap):
    """Custom mode may map a module already in the folder: it (and what it imports) is recorded."""
    before = snap(hf_folder)
    res = pp.apply(
        hf_folder, auto_map={"AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM"}
    )
    assert {c.path: c.action for c in res.changes}["configuration_remote.py"] == "unchanged"
    ver = pp.verify_pinned(hf_folder)
    assert set(ver.modules) == {"modeling_remote.py", "configuration_remote.py"}
    (hf_folder / "configuration_remote.py").write_text("evil = 1\n")
    with pytest.raises(NotPinnedError, match=r"configuration_remote\.py changed"):
        pp.verify_pinned(hf_folder)
    (hf_folder / "configuration_remote.py").write_bytes(b"class RemoteConfig: pass\n")
    pp.restore(hf_folder)
    assert snap(hf_folder) == before


def test_pin_document_does_not_recurse(tmp_path: Path, make_folder):
    """A legal but deep-ish document (under the limit) is walked without recursion."""
    folder = make_folder(tmp_path / "m")
    deep: dict = {"auto_map": {"AutoTokenizer": "tokenization_evil.T"}}
    for _ in range(80):  # 160 levels: under jsonio.MAX_JSON_DEPTH, far past any real config
        deep = {"nested": [deep]}
    (folder / "processor_config.json").write_text(json.dumps(deep))
    res = pp.apply(folder, family="tinytest")
    assert any(r["file"] == "processor_config.json" for r in res.removed_auto_map)
    pp.verify_pinned(folder)


def test_a_deep_but_legal_removed_value_is_recorded_and_restorable(hf_folder: Path, snap, run_cli):
    """The manifest quotes removed values a few levels down: it must stay readable."""
    value: object = "tokenization_evil.T"
    for _ in range(197):  # the document is 199 levels deep, just under the limit
        value = [value]
    (hf_folder / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": value}})
    )
    before = snap(hf_folder)
    p = run_cli("apply", "--model-family", "tinytest", "--model-path", str(hf_folder), "--json")
    assert p.returncode == pp.EXIT.OK, p.stderr
    assert len(json.loads(p.stdout)["removed_auto_map"]) == 2
    assert pp.status(hf_folder).intact
    pp.verify_pinned(hf_folder)
    p = run_cli("restore", "--model-path", str(hf_folder))
    assert p.returncode == pp.EXIT.OK, p.stderr
    assert snap(hf_folder) == before


def test_hostile_keys_cannot_break_the_output_lines(hf_folder: Path, run_cli):
    """Keys and values from the repo's files are printed escaped: one line each, no escapes."""
    doc = {"evil\nkey\x1b[2J": {"auto_map": {"AutoTokenizer\n\x1b[31m": "tokenization_evil.T"}}}
    (hf_folder / "processor_config.json").write_text(json.dumps(doc))
    p = run_cli("apply", "--model-family", "tinytest", "--model-path", str(hf_folder))
    assert p.returncode == pp.EXIT.OK, p.stderr
    assert "\x1b" not in p.stderr
    lines = [line for line in p.stderr.splitlines() if "unpinned  processor_config" in line]
    assert len(lines) == 1
    assert "evil\\nkey\\u001b[2J/auto_map" in lines[0]
