"""The tiny GutenOCR builder: the checkpoint format of the real model, native classes only."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("PIL")

import torch
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from pypto_testing.gutenocr import SPECIALS, TINY_GUTENOCR, make_tiny_gutenocr


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_gutenocr(tmp_path_factory.mktemp("tiny-gutenocr") / "model", seed=1)


def test_folder_is_a_flat_4x_checkpoint_with_tokenizer_and_image_processor(folder):
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "qwen2_5_vl"
    assert "text_config" not in cfg  # flat, like GutenOCR-3B's own config.json
    assert cfg["rope_scaling"] == {"type": "mrope", "mrope_section": [8, 12, 12]}
    assert (folder / "model.safetensors").stat().st_size > 0
    assert (folder / "preprocessor_config.json").is_file()
    assert not (folder / "processor_config.json").exists()
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    ids = tok.convert_tokens_to_ids(SPECIALS)
    assert [cfg["vision_start_token_id"], cfg["vision_end_token_id"]] == ids[:2]
    assert [cfg["image_token_id"], cfg["video_token_id"]] == ids[2:]
    assert cfg["vocab_size"] == len(tok)


def test_native_class_loads_every_weight_and_generates(folder):
    model, info = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        str(folder), local_files_only=True, output_loading_info=True
    )
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert model.config.text_config.hidden_size == TINY_GUTENOCR["hidden_size"]
    out = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2, do_sample=False)
    assert out.shape == (1, 5)


def test_seed_makes_weights_reproducible(folder, tmp_path):
    again = make_tiny_gutenocr(tmp_path / "again", seed=1)
    other = make_tiny_gutenocr(tmp_path / "other", seed=2)
    a, b, c = (
        Qwen2_5_VLForConditionalGeneration.from_pretrained(str(p), local_files_only=True)
        for p in (folder, again, other)
    )
    wa, wb, wc = (m.lm_head.weight for m in (a, b, c))
    assert torch.equal(wa, wb)
    assert not torch.equal(wa, wc)


def test_builder_never_imports_the_model_package(tmp_path):
    """pypto-testing sits below the model packages: building the folder must not need them."""
    code = (
        "import sys\n"
        "from pypto_testing.gutenocr import make_tiny_gutenocr\n"
        f"make_tiny_gutenocr({str(tmp_path / 'm')!r})\n"
        "bad = sorted(m for m in sys.modules if m.startswith('pypto_models'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_building_leaves_the_module_config_untouched(folder):
    """transformers fills rope_scaling in place; the shared constant must not drift between builds."""
    assert TINY_GUTENOCR["rope_scaling"] == {"type": "mrope", "mrope_section": [8, 12, 12]}
