"""A tiny GutenOCR folder for tests: same structure as GutenOCR-3B, small sizes, random weights.

The folder is what a hub download holds: a flat Qwen2.5-VL config.json in the 4.x style
(top-level ``rope_scaling`` with ``type: mrope``), safetensors weights saved from
transformers' *native* Qwen2_5_VLForConditionalGeneration, a byte-level tokenizer with
Qwen's vision special tokens, and a slow (PIL) image processor. Public so cross-package
tests (the bench's pypto+graph arm) build the same folder; needs ``pypto-testing``.
"""

from __future__ import annotations

import json
from pathlib import Path

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


def make_tiny_gutenocr(path: str | Path, seed: int = 0) -> Path:
    import torch
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessor,
    )

    from pypto_testing.models import write_byte_tokenizer

    path = Path(path)
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
