"""A tiny LLaDA2-MoE folder in the published checkpoint format (pypto_testing.llada2)."""

from __future__ import annotations

import pytest
import torch

# Two shared cores: one thread per test process keeps timings stable under contention.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from pypto_testing.llada2 import make_tiny_llada2

    return make_tiny_llada2(tmp_path_factory.mktemp("llada2") / "tiny-llada2-mini")


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    from transformers import AutoModelForCausalLM

    import pypto_models_llada2  # noqa: F401  (registers llada2_moe)

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_dir), local_files_only=True, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def checkpoint_tensors(tiny_dir):
    from safetensors.torch import load_file

    return load_file(str(tiny_dir / "model.safetensors"))
