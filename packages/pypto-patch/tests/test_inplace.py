"""In-place apply / restore / status on torch-free HF-format folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pypto_patch as pp
from pypto_patch import (
    BadInputError,
    ConfigError,
    LockedError,
    ModelFolderError,
    ModifiedSincePatchError,
    NotPatchedError,
    ReadOnlyFolderError,
    UnknownFamilyError,
    UnsafePathError,
)

TINY_MAP = {
    "AutoConfig": "configuration_tinytest.TinyTestConfig",
    "AutoModelForCausalLM": "modeling_tinytest.TinyTestForCausalLM",
    "AutoModelForImageTextToText": "modeling_tinytest.TinyTestForCausalLM",
}


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_apply_pins_places_backs_up_and_records(hf_folder: Path, snap):
    before = snap(hf_folder)
    orig_config = _config(hf_folder)
    res = pp.apply(hf_folder, family="tinytest")
    assert res.action == "applied"
    assert res.mode == "in-place"
    cfg = _config(hf_folder)
    # pinned: exactly the preset's auto_map; the repo's tokenizer entry (its own code) is gone
    assert cfg["auto_map"] == TINY_MAP
    removed = {
        "file": "config.json",
        "at": "auto_map",
        "key": "AutoTokenizer",
        "value": ["tokenization_remote.RemoteTokenizer", None],
    }
    assert res.removed_auto_map == [removed]
    assert {k: v for k, v in cfg.items() if k != "auto_map"} == {
        k: v for k, v in orig_config.items() if k != "auto_map"
    }
    preset = pp.get_preset("tinytest")
    for rel, data in preset.files.items():
        assert (hf_folder / rel).read_bytes() == data
    # exactly one backup, of the only file that existed and changed
    backups = sorted(p.name for p in hf_folder.iterdir() if p.name.endswith(".pypto_orig"))
    assert backups == ["config.json.pypto_orig"]
    assert snap(hf_folder)["config.json.pypto_orig"][1:] == before["config.json"][1:]
    m = pp.read_manifest(hf_folder)
    assert m["schema_version"] == 2
    assert m["removed_auto_map"] == [removed]
    assert m["folder"]["path"] == str(hf_folder)
    assert m["folder"]["ino"] == os.stat(hf_folder).st_ino
    assert m["tool"] == "pypto-patch"
    assert m["tool_version"] == pp.__version__
    assert m["preset"]["family"] == "tinytest"
    assert m["preset"]["version"] == "0.1.0"
    assert m["preset"]["distribution"] == "pypto-models-tinytest"
    assert m["auto_map_before"] == orig_config["auto_map"]
    by_path = {f["path"]: f for f in m["files"]}
    assert by_path["config.json"]["action"] == "replaced"
    assert by_path["config.json"]["original_sha256"] == before["config.json"][1]
    assert by_path["modeling_tinytest.py"]["action"] == "created"
    # untouched files are untouched
    after = snap(hf_folder)
    for rel in ("model.safetensors", "tokenizer.json", "modeling_remote.py", "extras/README.md"):
        assert after[rel] == before[rel]
    st = pp.status(hf_folder)
    assert st.patched
    assert st.intact
    assert st.family == "tinytest"
    assert not st.interrupted


def test_restore_is_byte_identical_including_permissions(hf_folder: Path, snap):
    os.chmod(hf_folder / "config.json", 0o600)
    before = snap(hf_folder)
    pp.apply(hf_folder, family="tinytest_alt")  # also creates a sub-folder file
    assert (hf_folder / "extras" / "notes.txt").exists()
    assert oct(os.stat(hf_folder / "config.json").st_mode & 0o777) == oct(0o600)
    res = pp.restore(hf_folder)
    assert set(res.restored) == {"config.json"}
    assert snap(hf_folder) == before
    assert not pp.status(hf_folder).patched


def test_hub_cache_symlinks_are_replaced_not_written_through(tmp_path: Path, make_folder, snap):
    folder = make_folder(tmp_path / "snapshots" / "abc123", hf_cache_links=True)
    blobs = tmp_path / "snapshots" / "blobs"
    blobs_before = snap(blobs)
    before = snap(folder)
    assert (folder / "config.json").is_symlink()
    pp.apply(folder, family="tinytest")
    assert not (folder / "config.json").is_symlink()
    assert (folder / "config.json.pypto_orig").is_symlink()
    assert snap(blobs) == blobs_before  # the shared blob never changed
    pp.restore(folder)
    assert snap(folder) == before
    assert (folder / "config.json").is_symlink()


def test_reapply_same_preset_is_a_noop(hf_folder: Path, snap):
    pp.apply(hf_folder, family="tinytest")
    s1 = snap(hf_folder)
    m1 = (hf_folder / ".pypto_patch.json").read_bytes()
    res = pp.apply(hf_folder, family="tinytest")
    assert res.action == "unchanged"
    assert snap(hf_folder) == s1
    assert (hf_folder / ".pypto_patch.json").read_bytes() == m1


def test_other_preset_restores_first_then_applies(hf_folder: Path, snap):
    before = snap(hf_folder)
    pp.apply(hf_folder, family="tinytest")
    res = pp.apply(hf_folder, family="tinytest_alt")
    assert res.action == "applied"
    assert res.restored_first
    m = pp.read_manifest(hf_folder)
    assert m["preset"]["family"] == "tinytest_alt"
    # the backup is of the true original, not of the first patch
    assert snap(hf_folder)["config.json.pypto_orig"][1:] == before["config.json"][1:]
    assert "AutoModelForImageTextToText" not in _config(hf_folder)["auto_map"]
    pp.restore(hf_folder)
    assert snap(hf_folder) == before


def test_edited_patched_file_blocks_restore_unless_forced_and_edit_is_kept(hf_folder: Path, snap):
    before = snap(hf_folder)
    pp.apply(hf_folder, family="tinytest")
    (hf_folder / "modeling_tinytest.py").write_text("# my local fix\n")
    st = pp.status(hf_folder)
    assert st.changed_since == ["modeling_tinytest.py"]
    assert not st.intact
    with pytest.raises(ModifiedSincePatchError, match="--force") as ei:
        pp.restore(hf_folder)
    assert ei.value.exit_code == pp.EXIT.MODIFIED
    assert (hf_folder / "modeling_tinytest.py").read_text() == "# my local fix\n"
    # re-applying the same preset on an edited folder refuses too
    with pytest.raises(ModifiedSincePatchError):
        pp.apply(hf_folder, family="tinytest")
    res = pp.restore(hf_folder, force=True)
    assert res.kept_aside == {"modeling_tinytest.py": "modeling_tinytest.py.pypto_edited"}
    assert (hf_folder / "modeling_tinytest.py.pypto_edited").read_text() == "# my local fix\n"
    after = snap(hf_folder)
    del after["modeling_tinytest.py.pypto_edited"]
    assert after == before


def test_damaged_backup_is_never_restored(hf_folder: Path):
    pp.apply(hf_folder, family="tinytest")
    (hf_folder / "config.json.pypto_orig").unlink()
    with pytest.raises(ModifiedSincePatchError, match="backups"):
        pp.restore(hf_folder, force=True)
    assert pp.status(hf_folder).backups_damaged == ["config.json.pypto_orig"]


def test_stray_backup_from_an_older_tool_is_not_overwritten(hf_folder: Path, snap):
    (hf_folder / "config.json.pypto_orig").write_text('{"old": true}')
    before = snap(hf_folder)
    with pytest.raises(BadInputError, match="no pypto-patch manifest records it"):
        pp.apply(hf_folder, family="tinytest")
    assert snap(hf_folder) == before


def _bad(tmp_path: Path, make_folder, case: str):
    folder = make_folder(tmp_path / "m")
    kwargs: dict = {"family": "tinytest"}
    if case == "missing folder":
        return tmp_path / "nope", kwargs, ModelFolderError, "does not exist"
    if case == "no config":
        (folder / "config.json").unlink()
        return folder, kwargs, ModelFolderError, "no config.json"
    if case == "invalid json":
        (folder / "config.json").write_text('{\n  "a": 1,\n  "b": oops\n}\n')
        return folder, kwargs, ConfigError, "line 3, column 8"
    if case == "not an object":
        (folder / "config.json").write_text("[1, 2]")
        return folder, kwargs, ConfigError, "not an object"
    if case == "auto_map not an object":
        (folder / "config.json").write_text('{"auto_map": "x"}')
        return folder, kwargs, ConfigError, "auto_map"
    if case == "unknown family":
        return folder, {"family": "gemma9"}, UnknownFamilyError, "tinytest, tinytest_alt"
    if case == "mixed flags":
        return (
            folder,
            {"family": "tinytest", "auto_map": {"AutoConfig": "c.C"}},
            BadInputError,
            "not both",
        )
    if case == "nothing to apply":
        return folder, {}, BadInputError, "nothing to apply"
    if case == "copy source missing":
        return (
            folder,
            {"copies": {"a.py": "missing.py"}, "source_root": tmp_path},
            BadInputError,
            "does not exist",
        )
    if case == "dest escapes":
        (tmp_path / "s.py").write_text("x")
        return (
            folder,
            {"copies": {"../x.py": "s.py"}, "source_root": tmp_path},
            UnsafePathError,
            "escapes",
        )
    if case == "dest absolute":
        (tmp_path / "s.py").write_text("x")
        return (
            folder,
            {"copies": {"/tmp/x.py": "s.py"}, "source_root": tmp_path},
            UnsafePathError,
            "absolute",
        )
    if case == "dest is config":
        (tmp_path / "s.py").write_text("x")
        return (
            folder,
            {"copies": {"config.json": "s.py"}, "source_root": tmp_path},
            UnsafePathError,
            "manages",
        )
    if case == "auto_map module absent":
        return (
            folder,
            {"auto_map": {"AutoModel": "modeling_nowhere.M"}},
            BadInputError,
            "modeling_nowhere",
        )
    if case == "deeply nested config":
        (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
        return folder, kwargs, ConfigError, "nested too deeply"
    if case == "deeply nested value in config":
        (folder / "config.json").write_text('{"a": ' + "[" * 500 + "]" * 500 + "}")
        return folder, kwargs, ConfigError, "nested too deeply"
    if case == "integer too long":
        (folder / "config.json").write_text('{"a": ' + "9" * 5000 + "}")
        return folder, kwargs, ConfigError, "config.json is not usable JSON"
    if case == "NaN in config":
        (folder / "config.json").write_text('{"model_type": "llama", "rms_norm_eps": NaN}')
        return folder, kwargs, ConfigError, "config.json is not usable: it holds NaN, not a number"
    if case == "number past a float in config":
        (folder / "config.json").write_text('{"model_type": "llama", "rope_theta": 1e999}')
        return folder, kwargs, ConfigError, "beyond a float's range"
    if case == "deeply nested tokenizer_config":
        (folder / "tokenizer_config.json").write_text('{"x": ' + "[" * 100_000 + "}")
        return folder, kwargs, ConfigError, "tokenizer_config.json is JSON nested too deeply"
    if case == "read-only folder":
        os.chmod(folder, 0o555)
        return folder, kwargs, ReadOnlyFolderError, "read-only"
    if case == "dest through a symlinked folder":
        os.symlink(tmp_path, folder / "linked")
        (tmp_path / "s.py").write_text("x")
        return (
            folder,
            {"copies": {"linked/x.py": "s.py"}, "source_root": tmp_path},
            UnsafePathError,
            "symbolic link",
        )
    raise AssertionError(case)


BAD_CASES = [
    "missing folder",
    "no config",
    "invalid json",
    "not an object",
    "auto_map not an object",
    "unknown family",
    "mixed flags",
    "nothing to apply",
    "copy source missing",
    "dest escapes",
    "dest absolute",
    "dest is config",
    "auto_map module absent",
    "read-only folder",
    "dest through a symlinked folder",
    "deeply nested config",
    "deeply nested value in config",
    "integer too long",
    "NaN in config",
    "number past a float in config",
    "deeply nested tokenizer_config",
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_one_line_nonzero_and_changes_nothing(
    tmp_path: Path, make_folder, snap, case: str
):
    folder, kwargs, exc, needle = _bad(tmp_path, make_folder, case)
    before = snap(tmp_path)
    try:
        with pytest.raises(exc) as ei:
            pp.apply(folder, **kwargs)
        after = snap(tmp_path)
    finally:
        if folder.exists():
            os.chmod(folder, 0o755)
    msg = str(ei.value)
    assert needle in msg
    assert "\n" not in msg
    assert ei.value.exit_code != 0
    assert after == before


def test_restore_on_never_patched_folder(hf_folder: Path, snap):
    before = snap(hf_folder)
    with pytest.raises(NotPatchedError) as ei:
        pp.restore(hf_folder)
    assert ei.value.exit_code == pp.EXIT.NOT_PATCHED
    assert snap(hf_folder) == before


def test_custom_mode_with_relative_paths(tmp_path: Path, make_folder, snap, monkeypatch):
    folder = make_folder(tmp_path / "work" / "model")
    src = tmp_path / "work" / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "modeling_mine.py").write_text("class Mine: pass\n")
    (src / "pkg" / "helper.py").write_text("H = 1\n")
    before = snap(folder)
    monkeypatch.chdir(tmp_path / "work")
    res = pp.apply(
        "model",
        auto_map={"AutoModelForCausalLM": "modeling_mine.Mine"},
        copies={"modeling_mine.py": "modeling_mine.py", "sub/deep/helper.py": "pkg/helper.py"},
        source_root="src",
    )
    assert res.model_path == str(folder)
    assert res.family == "custom"
    assert res.created_dirs == ["sub", "sub/deep"]
    assert (folder / "sub" / "deep" / "helper.py").read_text() == "H = 1\n"
    cfg = _config(folder)
    # only what the user mapped: the repo's AutoConfig (its own code) left the view
    assert cfg["auto_map"] == {"AutoModelForCausalLM": "modeling_mine.Mine"}
    assert {r["key"] for r in res.removed_auto_map} == {"AutoConfig", "AutoTokenizer"}
    assert (
        pp.apply(
            "model",
            auto_map={"AutoModelForCausalLM": "modeling_mine.Mine"},
            copies={"modeling_mine.py": "modeling_mine.py", "sub/deep/helper.py": "pkg/helper.py"},
            source_root="src",
        ).action
        == "unchanged"
    )
    pp.restore("model")
    assert snap(folder) == before


def test_existing_remote_module_with_the_preset_name_is_backed_up(hf_folder: Path, snap):
    (hf_folder / "modeling_tinytest.py").write_text("# the hub's remote code\n")
    before = snap(hf_folder)
    res = pp.apply(hf_folder, family="tinytest")
    actions = {c.path: c.action for c in res.changes}
    assert actions["modeling_tinytest.py"] == "replaced"
    assert (
        hf_folder / "modeling_tinytest.py.pypto_orig"
    ).read_text() == "# the hub's remote code\n"
    pp.restore(hf_folder)
    assert snap(hf_folder) == before


def test_dry_run_changes_nothing(hf_folder: Path, snap):
    before = snap(hf_folder)
    res = pp.apply(hf_folder, family="tinytest", dry_run=True)
    assert res.action == "dry-run"
    assert {c.path for c in res.changes} == {
        "config.json",
        "configuration_tinytest.py",
        "modeling_tinytest.py",
    }
    assert snap(hf_folder) == before


def test_concurrent_run_waits_for_the_lock(hf_folder: Path, snap, tmp_path: Path):
    """A second run cannot get in while another holds the folder: it waits, then gives up."""
    ready = tmp_path / "ready"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import time, pathlib
                from pypto_patch.fsops import dir_lock
                with dir_lock(pathlib.Path({str(hf_folder)!r})):
                    pathlib.Path({str(ready)!r}).write_text("1")
                    time.sleep(3)
                """
            ),
        ]
    )
    try:
        for _ in range(200):
            if ready.exists():
                break
            import time

            time.sleep(0.05)
        before = snap(hf_folder)
        with pytest.raises(LockedError) as ei:
            pp.apply(hf_folder, family="tinytest", lock_timeout=0.3)
        assert ei.value.exit_code == pp.EXIT.LOCKED
        assert snap(hf_folder) == before
    finally:
        holder.wait(timeout=30)
    assert pp.apply(hf_folder, family="tinytest", lock_timeout=5).action == "applied"


def test_bad_second_preset_leaves_the_first_patch_in_place(hf_folder: Path, snap, tmp_path: Path):
    pp.apply(hf_folder, family="tinytest")
    (hf_folder / "extras").rename(tmp_path / "moved")
    (hf_folder / "extras").write_text("now a file")  # tinytest_alt needs extras/ to be a folder
    patched = snap(hf_folder)
    with pytest.raises(UnsafePathError):
        pp.apply(hf_folder, family="tinytest_alt")
    assert snap(hf_folder) == patched
