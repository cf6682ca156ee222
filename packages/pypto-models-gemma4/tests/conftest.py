"""Tiny Gemma 4 folders in the published checkpoints' format (pypto_testing.gemma4).

Session-scoped: each folder is built once (random weights, seconds) and only read by the
tests; a test that changes a folder copies it first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pypto_testing.folders import folder_bytes
from pypto_testing.gemma4 import make_tiny_gemma4


@pytest.fixture(autouse=True, scope="session")
def _few_threads():
    # 2 shared cores: inductor's compile workers and intra-op threads fight otherwise.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_31b(tmp_path_factory) -> Path:
    """31B structure: 5 sliding : 1 full, K = V full layers with their own head shape, vision tower."""
    return make_tiny_gemma4(tmp_path_factory.mktemp("g4") / "tiny-31b", "31b")


@pytest.fixture(scope="session")
def tiny_31b_alt(tmp_path_factory) -> Path:
    """The same structure with another layer-type pattern (1:1) and no vision tower."""
    return make_tiny_gemma4(
        tmp_path_factory.mktemp("g4") / "tiny-31b-1to1", "31b", pattern="1to1", vision=False, seed=1
    )


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> Path:
    return make_tiny_gemma4(tmp_path_factory.mktemp("g4") / "tiny-26b-a4b", "26b_a4b", seed=2)


@pytest.fixture(scope="session")
def tiny_e2b(tmp_path_factory) -> Path:
    return make_tiny_gemma4(tmp_path_factory.mktemp("g4") / "tiny-e2b", "e2b", seed=3)


def pin(folder: Path, family: str) -> Path:
    """What ``pypto-patch apply`` leaves in a folder: the shims and the merged auto_map."""
    from pypto_models_gemma4.preset import PRESETS

    preset = PRESETS[family]
    for name, text in preset["files"].items():
        (folder / name).write_text(text)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = preset["auto_map"]
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


@pytest.fixture
def pinned_copy(tmp_path):
    """``pinned_copy(src, family)``: a copy of ``src`` pinned with ``family``."""

    def make(src: Path, family: str) -> Path:
        dst = tmp_path / f"{src.name}-{family}"
        shutil.copytree(src, dst)
        return pin(dst, family)

    return make


folder_state = folder_bytes  # "nothing changed on disk" = before == after


@pytest.fixture
def snapshot():
    return folder_state
