import pytest

pytest.importorskip("transformers")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pypto_testing.models import TINY_CONFIGS, make_tiny_model, read_config


@pytest.mark.parametrize("arch", sorted(TINY_CONFIGS))
def test_tiny_model_loads_offline_and_generates(tmp_path, arch):
    path = make_tiny_model(tmp_path / arch, arch, seed=1)
    assert (path / "model.safetensors").stat().st_size > 0
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    ids = tok("abc", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, ids["input_ids"].shape[1] + 3)
    assert read_config(path)["architectures"] == TINY_CONFIGS[arch]["architectures"]


def test_seed_makes_weights_reproducible(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "a", seed=3))
    b = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "b", seed=3))
    c = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "c", seed=4))
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb)
    assert not torch.equal(wa, wc)


def test_byte_tokenizer_round_trips_any_text(tmp_path):
    path = make_tiny_model(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(path)
    text = "naïve café — 你好 \t\n!"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_unknown_arch_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown tiny architecture 'nope'"):
        make_tiny_model(tmp_path / "x", "nope")
