"""Shared fixtures: the test-only family package, HF-format folders, snapshots, the CLI.

The family package (tests/fixtures/pypto_models_tinytest) is made *installed* the way
importlib.metadata sees any installed distribution: a ``.dist-info`` folder with its
``entry_points.txt`` on a sys.path entry. In-process tests get it on sys.path;
subprocess CLI tests get it through PYTHONPATH.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

# transformers reads HF_MODULES_CACHE once, at import: point it at a throwaway folder
# before any test imports it, so no test writes into the user's real cache.
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="pypto-patch-hfmodules-"))

FIXTURE_PKG = Path(__file__).parent / "fixtures" / "pypto_models_tinytest"


def _install_dist_info(site: Path, pkg_dir: Path) -> None:
    proj = tomllib.loads((pkg_dir / "pyproject.toml").read_text())["project"]
    name, version = proj["name"], proj["version"]
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, eps in proj.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{k} = {v}" for k, v in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="session")
def tinytest_paths(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    site = tmp_path_factory.mktemp("site")
    _install_dist_info(site, FIXTURE_PKG)
    return [str(site), str(FIXTURE_PKG / "src")]


@pytest.fixture(scope="session", autouse=True)
def _tinytest_installed(tinytest_paths: list[str]):
    sys.path[:0] = tinytest_paths
    yield
    for p in tinytest_paths:
        sys.path.remove(p)


@pytest.fixture(autouse=True)
def modules_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test purges its own modules cache, never the user's."""
    cache = tmp_path / "hf_modules"
    monkeypatch.setenv("HF_MODULES_CACHE", str(cache))
    return cache


@pytest.fixture
def cli_env(tinytest_paths: list[str], modules_cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*tinytest_paths, env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    env["HF_MODULES_CACHE"] = str(modules_cache)
    env.pop("PYPTO_PATCH_FAULT", None)
    return env


@pytest.fixture
def run_cli(cli_env: dict[str, str]):
    def run(
        *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pypto_patch", *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            env={**cli_env, **(env or {})},
            timeout=60,
        )

    return run


def _safetensors(tensors: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def write_hf_folder(path: Path, *, remote_code: bool = True, hf_cache_links: bool = False) -> Path:
    """A torch-free HF-format folder: config.json (with remote auto_map), safetensors, tokenizer files.

    ``hf_cache_links`` lays it out like a hub cache snapshot: files are symlinks into blobs/.
    """
    path.mkdir(parents=True)
    config = {
        "architectures": ["RemoteForCausalLM"],
        "model_type": "llama",
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-06,
        "torch_dtype": "float32",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    files: dict[str, bytes] = {}
    if remote_code:
        config["auto_map"] = {
            "AutoConfig": "configuration_remote.RemoteConfig",
            "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
            "AutoTokenizer": ["tokenization_remote.RemoteTokenizer", None],
        }
        files["configuration_remote.py"] = b"class RemoteConfig: pass\n"
        files["modeling_remote.py"] = (
            b"from .configuration_remote import RemoteConfig\nclass RemoteForCausalLM: pass\n"
        )
    files["config.json"] = json.dumps(config, indent=2).encode()
    files["model.safetensors"] = _safetensors(
        {"w": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4))}
    )
    files["tokenizer.json"] = json.dumps(
        {"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}}
    ).encode()
    files["tokenizer_config.json"] = b'{"model_max_length": 16}\n'
    files["generation_config.json"] = b'{"do_sample": false}\n'
    files["extras/README.md"] = b"sub-folder content\n"
    for rel, data in files.items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if hf_cache_links and "/" not in rel:
            blob = path.parent / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(exist_ok=True)
            blob.write_bytes(data)
            os.symlink(os.path.relpath(blob, path), target)
        else:
            target.write_bytes(data)
    os.chmod(path / "model.safetensors", 0o640) if not hf_cache_links else None
    return path


@pytest.fixture
def hf_folder(tmp_path: Path) -> Path:
    return write_hf_folder(tmp_path / "models" / "tiny-remote.v1")


@pytest.fixture
def make_folder():
    return write_hf_folder


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root``: kind, bytes hash or link target, permission bits."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = (
                    "file",
                    hashlib.sha256(p.read_bytes()).hexdigest(),
                    stat.S_IMODE(st.st_mode),
                )
    return out


@pytest.fixture
def snap():
    return snapshot
