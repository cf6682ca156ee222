"""Tiny MiniMax folders in the released checkpoints' formats (pypto_testing.minimax).

Session-scoped: each folder is built once (random weights, seconds) and only read by the
tests; a test that changes a folder copies it first.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

from pypto_testing.folders import folder_bytes

# transformers < 5.12 has no minimax_m3_vl: this package does not install there (its range
# starts at 5.12), and a shared environment at an older transformers collects nothing here.
if importlib.util.find_spec("transformers.models.minimax_m3_vl") is None:  # pragma: no cover
    collect_ignore_glob = ["test_*.py"]

from pypto_testing.minimax import make_tiny_minimax_m3, make_tiny_minimax_m27


@pytest.fixture(autouse=True, scope="session")
def _few_threads():
    # 2 shared cores: inductor's compile workers and intra-op threads fight otherwise.
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """DecodeStepRunner compiles one bound ``_step`` code object per process, which dynamo
    allows 8 compilations of: start and leave each test clean."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="session")
def m27_fp8(tmp_path_factory) -> tuple[Path, Path]:
    """The FP8 release's format, and a native float32 folder holding what it means."""
    root = tmp_path_factory.mktemp("m27")
    folder = make_tiny_minimax_m27(
        root / "MiniMax-M2.7-tiny", weights="fp8", reference_path=root / "reference"
    )
    return folder, root / "reference"


@pytest.fixture(scope="session")
def m27_bf16(tmp_path_factory) -> Path:
    return make_tiny_minimax_m27(
        tmp_path_factory.mktemp("m27bf16") / "MiniMax-M2.7-bf16-tiny", weights="bf16", seed=1
    )


@pytest.fixture(scope="session")
def m3(tmp_path_factory) -> Path:
    return make_tiny_minimax_m3(tmp_path_factory.mktemp("m3") / "MiniMax-M3-tiny", weights="bf16")


def pin(folder: Path, family: str) -> Path:
    from pypto_patch import apply

    apply(folder, family=family)
    return folder


@pytest.fixture
def copy_of(tmp_path):
    """``copy_of(src)``: a private copy of a session folder (to change or pin)."""

    def make(src: Path, name: str | None = None) -> Path:
        dst = tmp_path / (name or src.name)
        shutil.copytree(src, dst)
        return dst

    return make


folder_state = folder_bytes  # "nothing changed on disk" = before == after


@pytest.fixture
def snapshot():
    return folder_state


@pytest.fixture
def pinned(copy_of):
    """``pinned(src, family)``: a private copy of ``src`` pinned by pypto-patch."""

    def make(src: Path, family: str) -> Path:
        return pin(copy_of(src), family)

    return make
