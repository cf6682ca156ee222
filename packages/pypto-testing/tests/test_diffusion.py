import subprocess
import sys

import pytest

pytest.importorskip("transformers")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pypto_testing.diffusion import (
    CONFIG_SHIM,
    MODEL_SHIM,
    TinyDiffusionLM,
    make_tiny_diffusion_model,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_diffusion_model(tmp_path_factory.mktemp("m") / "diffusion", seed=0)


def test_folder_loads_as_remote_code_and_runs_the_protocol(folder):
    for shim in (CONFIG_SHIM, MODEL_SHIM):
        text = (folder / shim).read_text()
        assert "pypto_testing.diffusion" in text
        assert "pypto_bench" not in text  # a test model must not need the bench installed
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), local_files_only=True, trust_remote_code=True
    )
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert type(model).__name__ == "TinyDiffusionLM"
    ids = tok(["abcd", "wxyz"], return_tensors="pt")["input_ids"]
    out = model.diffusion_generate(ids, gen_length=8, steps=4, block_length=4)
    assert out.sequences.shape == (2, ids.shape[1] + 8)
    assert out.num_denoising_steps == 4
    assert torch.equal(out.sequences[:, : ids.shape[1]], ids)
    assert not (out.sequences[:, ids.shape[1] :] == model.config.mask_token_id).all()


def test_forward_is_used_for_every_step(folder):
    model = TinyDiffusionLM.from_pretrained(str(folder), local_files_only=True)
    ids = torch.tensor([[5, 6, 7]])
    calls = []

    def forward(x):
        calls.append(tuple(x.shape))
        return model(input_ids=x, use_cache=False).logits

    plain = model.diffusion_generate(ids, gen_length=4, steps=2)
    hooked = model.diffusion_generate(ids, gen_length=4, steps=2, forward=forward)
    assert calls == [(1, 7), (1, 7)]
    assert torch.equal(plain.sequences, hooked.sequences)
    with pytest.raises(ValueError, match="multiple of block_length"):
        model.diffusion_generate(ids, gen_length=4, steps=2, block_length=3)


def test_module_does_not_import_pypto_bench():
    code = "import sys, pypto_testing.diffusion; print('pypto_bench' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
