"""A module state saved and put back: the very objects (what a compiled graph's guards
check), on a real transformers model whose experts' forward pypto-capture swaps."""

from __future__ import annotations

import torch

from pypto_bench.model_state import snapshot
from pypto_capture.moe_exact import swap_forward


def _tiny() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def test_each_state_comes_back_with_the_same_objects() -> None:
    model = _tiny()
    mlp = model.model.layers[0].mlp
    loaded = snapshot(model)
    undo = swap_forward(mlp, lambda self, x: x * 0, "_test_mark")
    patched_forward = vars(mlp)["forward"]
    extra = torch.nn.Identity()
    model.model.layers[1].add_module("extra", extra)
    patched = snapshot(model)
    ids = torch.tensor([[1, 2, 3]])

    loaded.restore()
    assert "forward" not in vars(mlp)
    assert not hasattr(mlp, "_test_mark")
    assert "extra" not in model.model.layers[1]._modules
    reference = model(ids).logits

    patched.restore()
    assert vars(mlp)["forward"] is patched_forward  # the same bound forward, not a copy
    assert model.model.layers[1].extra is extra
    assert not torch.equal(model(ids).logits, reference)

    loaded.restore()
    assert torch.equal(model(ids).logits, reference)
    undo()  # the patch's own undo still works on a restored model
    assert "forward" not in vars(mlp)


def test_parameters_are_not_copied() -> None:
    model = _tiny()
    weight = model.lm_head.weight
    state = snapshot(model)
    with torch.no_grad():
        weight.add_(1.0)  # in place: the state holds the tensor, not its values
    state.restore()
    assert model.lm_head.weight is weight
    assert float(weight.detach().mean()) == float(weight.detach().mean())
