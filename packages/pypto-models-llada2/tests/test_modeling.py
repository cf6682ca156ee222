"""The modeling against the checkpoint format and against straightforward formulas."""

import json

import pytest
import torch
import torch.nn.functional as F

from pypto_models_llada2 import LLaDA2MoeModel, LLaDA2MoeModelLM
from pypto_models_llada2.modeling import additive_mask, block_causal_allowed


def test_loads_the_checkpoint_names_unchanged(tiny_model, checkpoint_tensors, tiny_dir):
    assert type(tiny_model) is LLaDA2MoeModelLM
    assert json.loads((tiny_dir / "config.json").read_text())["architectures"] == [
        "LLaDA2MoeModelLM"
    ]
    state = tiny_model.state_dict()
    moe = 1  # first_k_dense_replace = 1: layer 0 is dense, 1.. are MoE
    for name, tensor in checkpoint_tensors.items():
        if ".mlp.experts." in name:
            continue  # merged below
        assert torch.equal(state[name], tensor), name
    experts = 16
    gate_up = state[f"model.layers.{moe}.mlp.experts.gate_up_proj"]
    down = state[f"model.layers.{moe}.mlp.experts.down_proj"]
    assert gate_up.shape[0] == down.shape[0] == experts
    for e in range(experts):
        p = f"model.layers.{moe}.mlp.experts.{e}"
        merged = torch.cat(
            [checkpoint_tensors[f"{p}.gate_proj.weight"], checkpoint_tensors[f"{p}.up_proj.weight"]]
        )
        assert torch.equal(gate_up[e], merged)
        assert torch.equal(down[e], checkpoint_tensors[f"{p}.down_proj.weight"])
    rotary = tiny_model.model.rotary_emb
    dim = tiny_model.config.rotary_dims
    expected = 1.0 / (tiny_model.config.rope_theta ** (torch.arange(0, dim, 2).float() / dim))
    assert torch.equal(rotary.inv_freq, expected)  # recomputed at load, not left uninitialised


def test_save_pretrained_writes_the_checkpoint_names_back(tiny_model, checkpoint_tensors, tmp_path):
    from safetensors.torch import load_file

    tiny_model.save_pretrained(str(tmp_path))
    saved = {}
    for f in sorted(tmp_path.glob("*.safetensors")):
        saved.update(load_file(str(f)))
    assert set(saved) == set(checkpoint_tensors)
    for name, tensor in checkpoint_tensors.items():
        assert torch.equal(saved[name], tensor), name


def test_auto_model_builds_the_decoder_class(tiny_dir):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(tiny_dir), local_files_only=True)
    assert type(model) is LLaDA2MoeModel


def _block_mask(seq, block, batch=1, dtype=torch.float32):
    pos = torch.arange(seq)
    return additive_mask(block_causal_allowed(pos, pos, block), dtype)[None, None].expand(
        batch, 1, seq, seq
    )


def test_a_plain_forward_works_and_is_block_causal(tiny_model):
    """The published forward raises without a 4-D mask; here it uses the block-causal one."""
    ids = torch.randint(3, 250, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = tiny_model(ids).logits
        explicit = tiny_model(ids, attention_mask=_block_mask(20, 32, 2)).logits
        allowed = block_causal_allowed(torch.arange(20), torch.arange(20), 32)[None, None].expand(
            2, 1, 20, 20
        )
        as_bool = tiny_model(ids, attention_mask=allowed).logits
        block8 = tiny_model(ids, block_length=8).logits
        explicit8 = tiny_model(ids, attention_mask=_block_mask(20, 8, 2)).logits
        # block causality: changing block 2 (positions 16..19) leaves blocks 0-1 untouched
        changed = ids.clone()
        changed[:, 17] = 5
        after = tiny_model(changed, block_length=8).logits
    assert torch.equal(plain, explicit)
    assert torch.equal(plain, as_bool)
    assert torch.equal(block8, explicit8)
    # (close, not bitwise: the MoE groups tokens per expert, so matmul batch sizes differ)
    torch.testing.assert_close(after[:, :16], block8[:, :16], rtol=1e-5, atol=1e-5)
    assert (after[:, 16] - block8[:, 16]).abs().max() > 1e-2  # bidirectional inside the block


def test_a_wrong_mask_shape_is_one_line(tiny_model):
    ids = torch.zeros(1, 6, dtype=torch.long)
    with pytest.raises(ValueError, match=r"4-D attention_mask must be \[batch, 1, 6, 6\]"):
        tiny_model(ids, attention_mask=torch.zeros(1, 1, 5, 5))


def _naive_router(gate, h):
    """Group-limited routing, one token at a time, in float64 (the published rule)."""
    scores = torch.sigmoid(h.double() @ gate.weight.double().T)
    choice = scores + gate.expert_bias.double()
    per_group = gate.num_experts // gate.n_group
    ids, weights = [], []
    for t in range(h.shape[0]):
        groups = choice[t].view(gate.n_group, per_group)
        group_score = groups.sort(descending=True).values[:, :2].sum(-1)
        keep = group_score.argsort(descending=True)[: gate.topk_group]
        masked = torch.full_like(choice[t], float("-inf"))
        for g in keep.tolist():
            masked[g * per_group : (g + 1) * per_group] = choice[
                t, g * per_group : (g + 1) * per_group
            ]
        top = masked.argsort(descending=True)[: gate.top_k]
        w = scores[t, top]
        w = w / (w.sum() + 1e-20) * gate.routed_scaling_factor
        ids.append(top)
        weights.append(w)
    return torch.stack(ids), torch.stack(weights)


def test_router_and_experts_match_a_per_token_formula(tiny_model, checkpoint_tensors):
    block = tiny_model.model.layers[1].mlp
    h = torch.randn(12, tiny_model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ids, weights, _ = block.gate(h)
    ref_ids, ref_weights = _naive_router(block.gate, h)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights.double(), ref_weights, rtol=1e-6, atol=1e-7)
    # the whole MoE block: each token through its experts' checkpoint weights + the shared MLP
    expected = torch.zeros(12, h.shape[1], dtype=torch.float64)
    p = "model.layers.1.mlp"
    for t in range(12):
        x = h[t].double()
        for j, e in enumerate(ref_ids[t].tolist()):
            w = {
                n: checkpoint_tensors[f"{p}.experts.{e}.{n}_proj.weight"].double()
                for n in ("gate", "up", "down")
            }
            expected[t] += ref_weights[t, j] * (w["down"] @ (F.silu(w["gate"] @ x) * (w["up"] @ x)))
        s = {
            n: checkpoint_tensors[f"{p}.shared_experts.{n}_proj.weight"].double()
            for n in ("gate", "up", "down")
        }
        expected[t] += s["down"] @ (F.silu(s["gate"] @ x) * (s["up"] @ x))
    with torch.no_grad():
        got = block(h.unsqueeze(0))[0]
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("schedule", ["loop", "gather", "dense"])
def test_both_expert_schedules_agree(tiny_model, schedule):
    experts = tiny_model.model.layers[2].mlp.experts
    gen = torch.Generator().manual_seed(4)
    h = torch.randn(9, tiny_model.config.hidden_size, generator=gen)
    ids = torch.stack([torch.randperm(16, generator=gen)[:4] for _ in range(9)])
    w = torch.rand(9, 4, generator=gen)
    try:
        experts.schedule = "loop"
        ref = experts(h, ids, w)
        experts.schedule = schedule
        got = experts(h, ids, w)
    finally:
        experts.schedule = "auto"
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)  # fp32 rounding of |x| ~ 30


def test_a_checkpoint_lacking_a_layer_is_refused_in_one_line(
    tiny_dir, checkpoint_tensors, tmp_path
):
    import shutil

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from pypto_models_llada2 import LLaDA2CheckpointError

    folder = tmp_path / "truncated"
    shutil.copytree(tiny_dir, folder)
    save_file(
        {k: v for k, v in checkpoint_tensors.items() if not k.startswith("model.layers.2.")},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    with pytest.raises(LLaDA2CheckpointError) as info:
        AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True)
    message = str(info.value)
    assert "model.layers.2." in message
    assert "re-download" in message
    assert "\n" not in message
