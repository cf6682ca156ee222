"""Against real transformers: the placed class loads, a pinned folder never runs the repo's
own code, and the cache purge uses transformers' keys.

Loads run in subprocesses: transformers reads HF_MODULES_CACHE once, at import, and
each test needs its own cache folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pypto_patch as pp

pytest.importorskip("transformers")
pytest.importorskip("torch")
models = pytest.importorskip("pypto_testing.models")

LOAD = textwrap.dedent(
    """
    import json, sys
    import torch
    torch.set_num_threads(1)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    out = {}
    for path in sys.argv[1:]:
        kw = dict(trust_remote_code=True, local_files_only=True)
        cfg = AutoConfig.from_pretrained(path, **kw)
        m = AutoModelForCausalLM.from_pretrained(path, **kw)
        entry = {
            "config": type(cfg).__name__,
            "config_marker": getattr(cfg, "PYPTO_TINYTEST_MARKER", None),
            "model": type(m).__name__,
            "model_marker": getattr(m, "PYPTO_TINYTEST_MARKER", None),
            "checksum": float(sum(p.double().sum() for p in m.parameters())),
        }
        try:
            entry["image_text"] = type(AutoModelForImageTextToText.from_pretrained(path, **kw)).__name__
        except Exception as e:
            entry["image_text"] = "error: " + type(e).__name__
        out[path] = entry
    print(json.dumps(out))
    """
)


def _load(paths: list[Path], env: dict[str, str], cwd: Path | None = None) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", LOAD, *map(str, paths)],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _weights_checksum(folder: Path) -> float:
    from safetensors.numpy import load_file

    return float(
        sum(
            t.astype("float64").sum() for t in load_file(str(folder / "model.safetensors")).values()
        )
    )


@pytest.mark.slow
def test_placed_class_is_what_from_pretrained_returns(tmp_path: Path, cli_env, snap, monkeypatch):
    work = tmp_path / "work"
    folder = models.make_tiny_model(work / "tiny-llama", arch="llama")
    before = snap(folder)
    monkeypatch.chdir(work)  # relative paths in both modes
    pp.apply("tiny-llama", family="tinytest", output_dir="overlay")
    assert snap(folder) == before  # the overlay left the original untouched
    pp.apply("tiny-llama", family="tinytest")
    got = _load([Path("tiny-llama"), Path("overlay")], cli_env, cwd=work)
    for path in ("tiny-llama", "overlay"):
        g = got[path]
        assert g["config"] == "TinyTestConfig"
        assert g["config_marker"] == "config-from-pypto_models_tinytest"
        assert g["model"] == "TinyTestForCausalLM"
        assert g["model_marker"] == "model-from-pypto_models_tinytest"
        assert (
            g["image_text"] == "TinyTestForCausalLM"
        )  # an image-text load picks the preset up too
        # the folder's real weights were loaded, not a fresh init
        assert g["checksum"] == pytest.approx(_weights_checksum(folder), rel=1e-6)
    pp.restore("tiny-llama")
    assert snap(folder) == before


def _remote_folder(path: Path, marker: str) -> Path:
    """A folder whose config points at remote code, as a hub repo with custom code has it."""
    path.mkdir(parents=True)
    (path / "configuration_remote.py").write_text(
        f"from transformers import LlamaConfig\n\nclass RemoteConfig(LlamaConfig):\n    MARK = {marker!r}\n"
    )
    (path / "modeling_remote.py").write_text("from .configuration_remote import RemoteConfig\n")
    cfg = {
        "model_type": "llama",
        "hidden_size": 16,
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "auto_map": {"AutoConfig": "configuration_remote.RemoteConfig"},
    }
    (path / "config.json").write_text(json.dumps(cfg))
    return path


CACHE_LOAD = textwrap.dedent(
    """
    import sys
    from transformers import AutoConfig
    from transformers.dynamic_module_utils import get_class_from_dynamic_module
    for path in sys.argv[1:]:
        AutoConfig.from_pretrained(path, trust_remote_code=True, local_files_only=True)
        get_class_from_dynamic_module("modeling_remote.RemoteConfig", path, local_files_only=True)
    """
)


def _entries(cache: Path) -> set[str]:
    base = cache / "transformers_modules"
    return {
        p.relative_to(base).as_posix()
        for p in base.glob("*/*")
        if p.is_dir() and p.name != "__pycache__"
    }


def test_cache_purge_removes_this_folders_entries_only(
    tmp_path: Path, cli_env, modules_cache: Path
):
    a = _remote_folder(tmp_path / "one" / "my-model.v2", "A")
    b = _remote_folder(tmp_path / "two" / "my-model.v2", "B")  # same basename, other code
    c = _remote_folder(tmp_path / "three" / "my-model.v2x", "A")  # name contains a's name
    p = subprocess.run(
        [sys.executable, "-c", CACHE_LOAD, str(a), str(b), str(c), "my-model.v2"],
        capture_output=True, text=True, env=cli_env, cwd=tmp_path / "one", timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    before = _entries(modules_cache)
    # our key computation names exactly the folders transformers created for `a`
    keys = pp.folder_cache_keys(a)
    mine = {f"{n}/{h}" for n in keys.names for h in keys.hashes}
    assert mine & before
    assert keys.names == ("my_hyphen_model_dot_v2",)
    assert pp.local_module_hash(a, "configuration_remote.py") in {e.split("/")[1] for e in before}
    res = pp.apply(a, family="tinytest")
    after = _entries(modules_cache)
    assert before - after == mine & before
    assert set(res.cache_purged) == {
        str(modules_cache / "transformers_modules" / e) for e in mine & before
    }
    # b's and c's entries are still there
    for other in (b, c):
        k = pp.folder_cache_keys(other)
        theirs = {f"{n}/{h}" for n in k.names for h in k.hashes} & before
        assert theirs
        assert theirs <= after


def test_modules_cache_location_follows_env(tmp_path: Path):
    d = pp.modules_cache_dir
    assert d({"HF_MODULES_CACHE": "/x/m", "HF_HOME": "/y"}) == Path("/x/m")
    assert d({"HF_HOME": "/y"}) == Path("/y/modules")
    assert d({"XDG_CACHE_HOME": "/z"}) == Path("/z/huggingface/modules")
    assert d({}) == Path(os.path.expanduser("~/.cache/huggingface/modules"))


EVIL_TOKENIZER = '''"""Stands for a repo's own tokenizer code: importing it is running it."""
import os
import pathlib

pathlib.Path(os.environ["PYPTO_EVIL_MARKER"]).write_text("tokenization_evil ran")

from transformers import PreTrainedTokenizerFast


class EvilTokenizer(PreTrainedTokenizerFast):
    pass
'''

EVIL_GENERATE = '''"""A repo's custom_generate: from_pretrained(trust_remote_code=True) imports it."""
import os
import pathlib

pathlib.Path(os.environ["PYPTO_EVIL_MARKER"] + ".generate").write_text("generate ran")


def generate(model, *args, **kwargs):
    raise RuntimeError("the repo's generate ran")
'''

PINNED_LOAD = textwrap.dedent(
    """
    import json, sys
    import torch
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import pypto_patch
    out = {}
    for path in sys.argv[2:]:
        if sys.argv[1] == "verify":
            pypto_patch.verify_pinned(path)  # only then is remote code allowed
        kw = dict(trust_remote_code=True, local_files_only=True)
        entry = {}
        for name, auto in (("tokenizer", AutoTokenizer), ("model", AutoModelForCausalLM)):
            try:
                entry[name] = type(auto.from_pretrained(path, **kw)).__name__
            except Exception as e:
                entry[name] = "error: " + type(e).__name__
        out[path] = entry
    print(json.dumps(out))
    """
)


def _evil_folder(path: Path) -> Path:
    folder = models.make_tiny_model(path, arch="llama")
    (folder / "tokenization_evil.py").write_text(EVIL_TOKENIZER)
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    tok["auto_map"] = {"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok, indent=2))
    (folder / "custom_generate").mkdir()
    (folder / "custom_generate" / "generate.py").write_text(EVIL_GENERATE)
    return folder


def _run_load(mode: str, paths: list[Path], env: dict[str, str], marker: Path) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", PINNED_LOAD, mode, *map(str, paths)],
        capture_output=True, text=True, env={**env, "PYPTO_EVIL_MARKER": str(marker)}, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_pinned_folder_never_runs_the_repos_own_code(tmp_path: Path, cli_env, snap):
    """The repo's tokenizer auto_map and custom_generate run on load before pinning, never after."""
    control = _evil_folder(tmp_path / "control" / "m")
    marker = tmp_path / "control-marker"
    got = _run_load("plain", [control], cli_env, marker)
    # the hostile folder is real: unpinned, trust_remote_code runs both pieces of its code
    assert marker.read_text() == "tokenization_evil ran"
    assert Path(f"{marker}.generate").read_text() == "generate ran"
    assert got[str(control)]["tokenizer"] == "EvilTokenizer"

    folder = _evil_folder(tmp_path / "work" / "m")
    before = snap(folder)
    overlay = tmp_path / "work" / "pinned"
    res_overlay = pp.apply(folder, family="tinytest", output_dir=overlay)
    assert snap(folder) == before
    inplace = tmp_path / "inplace" / "m"
    shutil.copytree(folder, inplace, symlinks=True)
    res_inplace = pp.apply(inplace, family="tinytest")
    for res in (res_overlay, res_inplace):
        assert {
            "file": "tokenizer_config.json",
            "at": "auto_map",
            "key": "AutoTokenizer",
            "value": [None, "tokenization_evil.EvilTokenizer"],
        } in res.removed_auto_map
        assert any(
            c.path == "custom_generate/generate.py" and c.action == "removed" for c in res.changes
        )
    marker = tmp_path / "pinned-marker"
    got = _run_load("verify", [overlay, inplace], cli_env, marker)
    assert not marker.exists()
    assert not Path(f"{marker}.generate").exists()
    for path in (overlay, inplace):
        # the folder's native tokenizer (transformers' own class), not the repo's
        assert got[str(path)]["tokenizer"] in ("TokenizersBackend", "PreTrainedTokenizerFast")
        assert got[str(path)]["model"] == "TinyTestForCausalLM"
    pp.restore(inplace)
    assert snap(inplace) == before
