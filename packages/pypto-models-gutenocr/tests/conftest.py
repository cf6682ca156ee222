"""A tiny GutenOCR folder: same structure as GutenOCR-3B, small sizes, random weights.

The folder is what a hub download holds: a flat Qwen2.5-VL config.json in the
4.x style (top-level ``rope_scaling`` with ``type: mrope``), safetensors weights
saved from transformers' *native* Qwen2_5_VLForConditionalGeneration, a byte-level
tokenizer with Qwen's vision special tokens, and a slow (PIL) image processor.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

_RUN = tempfile.mkdtemp(prefix="pypto-gutenocr-model-tests-")
for var, sub in (
    ("TILE_FWK_OUTPUT_DIR", "output"),
    ("ASCEND_PROCESS_LOG_PATH", "log"),
    ("PYPTO_HOME", "home"),
):
    os.environ.setdefault(var, os.path.join(_RUN, sub))
    os.makedirs(os.environ[var], exist_ok=True)

SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

TINY = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
    "max_position_embeddings": 1024,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "vision_config": {
        "depth": 2,
        "hidden_size": 32,
        "out_hidden_size": 128,
        "num_heads": 2,
        "intermediate_size": 64,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 56,
        "fullatt_block_indexes": [1],
        "in_channels": 3,
    },
}


def make_tiny_gutenocr(path, seed: int = 0):
    import torch
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessor,
    )

    from pypto_testing.models import write_byte_tokenizer

    path.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(path)
    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    cfg = dict(TINY)
    cfg.update(
        vocab_size=len(tok),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**cfg)).eval()
    model.save_pretrained(str(path), safe_serialization=True)
    # Keep the checkpoint's 4.x-style flat config (what the real GutenOCR-3B ships).
    (path / "config.json").write_text(json.dumps({**cfg, "dtype": "float32"}, indent=1))
    image_processor = Qwen2VLImageProcessor(
        min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    # No processor_config: Qwen2_5_VLProcessor wants a video processor (torchvision);
    # the CLI then pairs the slow image processor with the tokenizer itself.
    image_processor.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


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
