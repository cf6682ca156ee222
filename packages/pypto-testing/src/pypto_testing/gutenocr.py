"""A tiny GutenOCR folder: GutenOCR-3B's structure and checkpoint format, small sizes, random weights.

The folder is what a hub download holds: a flat Qwen2.5-VL config.json in the 4.x style
(top-level ``rope_scaling`` with ``type: mrope``), safetensors weights saved from
transformers' *native* ``Qwen2_5_VLForConditionalGeneration``, a byte-level tokenizer with
Qwen's vision special tokens, and a slow (PIL) image processor.

It lives here, not in pypto-models-gutenocr, so the model package's library code never
imports test helpers; and it is built from transformers' native classes only, so
pypto-testing never depends on the model package (which tests it). Needs the ``models``
extra (torch, transformers, safetensors, tokenizers) and Pillow for the image processor.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from .models import write_byte_tokenizer

__all__ = ["SPECIALS", "TINY_GUTENOCR", "cli_argv", "make_tiny_gutenocr"]

#: Qwen2.5-VL's vision special tokens, added to the byte-level vocabulary.
SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

#: The tiny config: head_dim 64 (mrope_section [8, 12, 12] covers its half), GQA 2 -> 1,
#: a two-block vision tower with one full-attention block, like the 3B model's layout.
TINY_GUTENOCR: dict[str, Any] = {
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
    """Write the tiny GutenOCR folder at ``path`` (created if missing) and return it."""
    import torch
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessor,
    )

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(path)
    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    cfg: dict[str, Any] = copy.deepcopy(TINY_GUTENOCR)
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
    # The config class fills rope_scaling in place: build from a copy, write the original.
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**copy.deepcopy(cfg))).eval()
    model.save_pretrained(str(path), safe_serialization=True)
    # Keep the checkpoint's 4.x-style flat config (what the real GutenOCR-3B ships).
    (path / "config.json").write_text(json.dumps({**cfg, "dtype": "float32"}, indent=1))
    image_processor = Qwen2VLImageProcessor(
        min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    # No processor_config: Qwen2_5_VLProcessor wants a video processor (torchvision);
    # pypto-gutenocr then pairs the slow image processor with the tokenizer itself.
    image_processor.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def cli_argv(
    command: str, folder: str | Path, *flags: str, device: str = "cpu", **options: Any
) -> list[str]:
    """A ``pypto-gutenocr`` command line: ``command --model-path folder --device device``,
    then every option as ``--name value`` (names as the CLI spells them, e.g.
    ``output_length``), then ``flags`` as given. The tests' one spelling of it."""
    argv = [command, "--model-path", str(folder), "--device", device]
    for name, value in options.items():
        argv += [f"--{name}", str(value)]
    return [*argv, *flags]
