"""Tiny Kimi-Linear folders in the published checkpoint format (pypto_testing.kimi).

Session-scoped: the folder is built once (random weights, seconds) and only read by the
tests; a test that changes a folder copies it first.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

from pypto_testing.folders import folder_bytes

# transformers < 5.17 has no kimi_linear: this package does not install there (its range
# starts at 5.17), and a shared environment at an older transformers collects nothing here.
if importlib.util.find_spec("transformers.models.kimi_linear") is None:  # pragma: no cover
    collect_ignore_glob = ["test_*.py"]

from pypto_testing.kimi import make_tiny_kimi_linear

FAMILY = "kimi_linear_48b_a3b"


@pytest.fixture(autouse=True, scope="session")
def _few_threads():
    # 2 shared cores: inductor's compile workers and intra-op threads fight otherwise.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def kimi(tmp_path_factory) -> tuple[Path, Path]:
    """The published format, and a native float32 folder holding the same weights."""
    root = tmp_path_factory.mktemp("kimi")
    folder = make_tiny_kimi_linear(
        root / "Kimi-Linear-48B-A3B-Instruct-tiny", reference_path=root / "reference"
    )
    return folder, root / "reference"


def pin(folder: Path) -> Path:
    from pypto_patch import apply

    apply(folder, family=FAMILY)
    return folder


@pytest.fixture
def copy_of(tmp_path):
    """``copy_of(src)``: a private copy of a session folder (to change or pin)."""

    def make(src: Path, name: str | None = None) -> Path:
        dst = tmp_path / (name or src.name)
        shutil.copytree(src, dst)
        return dst

    return make


@pytest.fixture
def snapshot():
    """Nothing changed on disk means ``snapshot(folder)`` before == after."""
    return folder_bytes


@pytest.fixture
def pinned(copy_of, kimi):
    """A private copy of the published-format folder, pinned by pypto-patch."""
    return pin(copy_of(kimi[0]))
