"""Tiny Qwen3-VL folders with the processor files an image prompt needs.

Why this exists: ``pypto-bench --image`` builds its input with the folder's own processor,
so a test of it needs a folder laid out as the hub's Qwen3-VL checkpoints are: Qwen's
vision special tokens in the tokenizer, ``preprocessor_config.json`` (naming
``Qwen3VLProcessor``), ``video_preprocessor_config.json`` and a chat template that places
the image. :func:`pypto_testing.architectures.make_tiny_architecture` writes the model and
a byte-level tokenizer whose 259 ids are all taken, so the vision tokens get ids of their
own after them (the config's ``image_token_id`` ... and the text vocabulary grow by four).

Built from transformers' native classes and plain JSON only; the image processor is
Qwen's (Pillow backend without torchvision). Needs the ``models`` extra.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from .architectures import ARCHITECTURES, make_tiny_architecture
from .models import SPECIAL_TOKENS

__all__ = [
    "QWEN3_VL_CHAT_TEMPLATE",
    "QWEN3_VL_VISION_TOKENS",
    "make_tiny_qwen3_vl",
    "write_qwen3_vl_processor",
]

#: Qwen's vision special tokens, in the order their ids follow the byte vocabulary.
QWEN3_VL_VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
_ID_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")

#: A short chat template that places images as Qwen's does (start, pad, end), roles as text.
QWEN3_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def make_tiny_qwen3_vl(path: str | Path, *, seed: int = 0, **overrides: Any) -> Path:
    """The tiny ``qwen3_vl`` of :mod:`pypto_testing.architectures` with ids for the vision
    tokens and the processor files (:func:`write_qwen3_vl_processor`)."""
    vocab = len(SPECIAL_TOKENS) + 256
    text = copy.deepcopy(ARCHITECTURES["qwen3_vl"]["config"]["text_config"])
    text.update(
        vocab_size=vocab + len(QWEN3_VL_VISION_TOKENS),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    ids: dict[str, Any] = {key: vocab + i for i, key in enumerate(_ID_KEYS)}
    folder = make_tiny_architecture(
        path, "qwen3_vl", seed=seed, text_config=text, **ids, **overrides
    )
    write_qwen3_vl_processor(folder)
    return folder


def write_qwen3_vl_processor(
    path: str | Path, *, min_pixels: int = 16 * 16, max_pixels: int = 64 * 64
) -> Path:
    """Add Qwen3-VL's processor files to a tiny qwen3_vl folder; returns the folder.

    The tokenizer gets the vision tokens appended (ids ``len(vocab) + i``) and the chat
    template; the config must name exactly those ids (``make_tiny_qwen3_vl`` builds it so),
    else ``ValueError``: a mismatch would put image features at the wrong positions.
    ``min_pixels`` / ``max_pixels`` bound the resized image (the tiny tower's patch grid).
    """
    from transformers import PreTrainedTokenizerFast

    folder = Path(path)
    config = json.loads((folder / "config.json").read_text())
    tok = PreTrainedTokenizerFast.from_pretrained(str(folder))
    tok.add_special_tokens({"additional_special_tokens": list(QWEN3_VL_VISION_TOKENS)})
    got = {
        k: tok.convert_tokens_to_ids(t)
        for k, t in zip(_ID_KEYS, QWEN3_VL_VISION_TOKENS, strict=True)
    }
    want = {k: config.get(k) for k in _ID_KEYS}
    vocab_size = int((config.get("text_config") or {}).get("vocab_size", 0))
    if got != want or len(tok) > vocab_size:
        raise ValueError(
            f"{folder}: the config's vision token ids {want} (vocab {vocab_size}) are not the "
            f"ids the tokenizer gives them {got} (vocab {len(tok)}): build the folder with "
            "make_tiny_qwen3_vl"
        )
    tok.chat_template = QWEN3_VL_CHAT_TEMPLATE
    tok.save_pretrained(str(folder))
    vision = config["vision_config"]
    common = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_size": int(vision["spatial_merge_size"]),
        "patch_size": int(vision["patch_size"]),
        "temporal_patch_size": int(vision["temporal_patch_size"]),
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": max_pixels, "shortest_edge": min_pixels},
        "processor_class": "Qwen3VLProcessor",
    }
    # What the hub's Qwen3-VL checkpoints ship: the processor class is named here.
    (folder / "preprocessor_config.json").write_text(
        json.dumps({**common, "image_processor_type": "Qwen2VLImageProcessor"}, indent=2)
    )
    (folder / "video_preprocessor_config.json").write_text(
        json.dumps(
            {
                **common,
                "video_processor_type": "Qwen3VLVideoProcessor",
                "fps": 2,
                "do_sample_frames": True,
                "min_frames": 4,
                "max_frames": 8,
            },
            indent=2,
        )
    )
    return folder.resolve()
