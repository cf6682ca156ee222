"""A tiny GutenOCR folder: same structure as GutenOCR-3B, small sizes, random weights.

The folder is what a hub download holds: a flat Qwen2.5-VL config.json in the
4.x style (top-level ``rope_scaling`` with ``type: mrope``), safetensors weights
saved from transformers' *native* Qwen2_5_VLForConditionalGeneration, a byte-level
tokenizer with Qwen's vision special tokens, and a slow (PIL) image processor.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from pypto_kernels_common import sim

sim.use_run_folders(Path(tempfile.mkdtemp(prefix="pypto-gutenocr-model-tests-")))
# Before anything imports pypto: PyPTO reads TILEFWK_CONFIG_PATH once, when its libraries
# load, and without the shim's quiet config every small SIM call draws swim-lane PNGs.
sim.prepare_environment()

from pypto_testing.gutenocr import make_tiny_gutenocr  # noqa: E402


@pytest.fixture(scope="session")
def tiny_gutenocr(tmp_path_factory):
    return make_tiny_gutenocr(tmp_path_factory.mktemp("tiny-gutenocr"))


@pytest.fixture(scope="session")
def tiny_image(tmp_path_factory):
    from PIL import Image

    path = tmp_path_factory.mktemp("img") / "page.png"
    img = Image.new("RGB", (84, 56), "white")
    for x in range(10, 70):
        img.putpixel((x, 28), (0, 0, 0))
    img.save(path)
    return path


@pytest.fixture(autouse=True)
def _switches_off():
    from pypto_kernels_gutenocr import PACKED, stats, switches

    for op in switches.OPS:
        switches.set_switch(op, False)
    stats.reset()
    PACKED.clear()
    yield
    for op in switches.OPS:
        switches.set_switch(op, False)
