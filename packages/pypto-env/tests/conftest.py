"""Fake CANN install trees and fake installed distributions, built for real on disk."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import pypto_common
import pypto_env

INFO_TEMPLATE = """package_name=Ascend-cann-toolkit
version={version}
innerversion=V100R001C99SPC001B001
arch={arch}
os=linux
path={path}
"""


def write_install_info(folder: Path, version: str, arch: str = "aarch64") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    info = folder / "ascend_toolkit_install.info"
    info.write_text(INFO_TEMPLATE.format(version=version, arch=arch, path=folder))
    return info


@pytest.fixture
def cann_tree(tmp_path: Path) -> Callable[..., Path]:
    """Build ``<tmp>/<prefix>/Ascend/{ascend-toolkit/latest | cann}`` and return that home.

    The ascend-toolkit layout is built the way the installer does it: a versioned folder
    with a ``latest`` symlink to it.
    """

    def build(
        version: str | None,
        layout: str = "cann",
        arch: str = "aarch64",
        prefix: str = "usr-local",
    ) -> Path:
        ascend = tmp_path / prefix / "Ascend"
        if layout == "ascend-toolkit":
            real = ascend / "ascend-toolkit" / (version or "unknown")
            real.mkdir(parents=True)
            home = ascend / "ascend-toolkit" / "latest"
            home.symlink_to(real, target_is_directory=True)
        else:
            home = ascend / "cann"
            home.mkdir(parents=True)
        if version is not None:
            write_install_info(home / f"{arch}-linux", version, arch)
        return home

    return build


def make_site(root: Path, dists: dict[str, str]) -> Path:
    """A sys.path folder holding ``*.dist-info`` metadata for the given name -> version."""
    root.mkdir(parents=True, exist_ok=True)
    for name, version in dists.items():
        info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


@pytest.fixture
def run_doctor(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python -S -m pypto_env`` seeing only pypto_env and the given fake dists.

    ``-S`` keeps the real site-packages (and whatever torch it holds) out of sight, so each
    test decides exactly which torch / torch_npu are "installed".
    """
    src = Path(pypto_env.__file__).resolve().parent.parent

    def run(
        *args: str,
        dists: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        site = make_site(tmp_path / f"site-{len(list(tmp_path.glob('site-*')))}", dists or {})
        # pypto-common is pypto-env's one dependency (standard library only, like it). Copy
        # the package itself: its parent may be a site-packages holding a real torch.
        shutil.copytree(
            Path(pypto_common.__file__).resolve().parent,
            site / "pypto_common",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        path = [str(site), str(src)]
        try:
            import tomllib  # noqa: F401
        except ImportError:  # pragma: no cover - Python 3.10: -S hides site-packages' tomli
            import tomli

            path.append(str(Path(tomli.__file__).resolve().parent.parent))
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_", "PYTHON"))}
        clean |= {
            "PYTHONPATH": os.pathsep.join(path),
            "HOME": str(tmp_path),
            "PYPTO_CANN_ROOTS": "",
        }
        clean |= env or {}
        return subprocess.run(
            [sys.executable, "-S", "-m", "pypto_env", *args],
            env=clean,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    return run


@pytest.fixture
def write_info() -> Callable[..., Path]:
    """``write_install_info`` as a fixture (importlib mode cannot import conftest)."""
    return write_install_info
