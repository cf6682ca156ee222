"""Capture-safe state for recurrent layers: DecodeStepRunner vs generate on tiny hybrids.

One real torch.compile (fullgraph, static shapes) per architecture, batch 2 with left
padding, replayed for two different prompts: the second proves the captured step reads the
new prompt's states (they are copied into the addresses the graph holds, never replaced)
and that nothing recompiles. Architectures: Gated DeltaNet + attention (Qwen3-Next), Mamba2,
attention and Mamba2 in one layer (Falcon-H1, layer type ``hybrid``), short conv +
attention (LFM2), and Nemotron-H's MLP / MoE blocks that hold no state at all.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
arch = pytest.importorskip("pypto_testing.architectures")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from pypto_capture import DecodeStepRunner, UnsupportedModelError  # noqa: E402

NEW = 16
MAX_LEN = 32


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("recurrent")
    made = {}

    def get(model_type):
        why = arch.available(model_type)
        if why:
            pytest.skip(why)
        if model_type not in made:
            made[model_type] = arch.make_tiny_architecture(root / model_type, model_type)
        return made[model_type]

    return get


def _prompts(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (2, 10), generator=g)
    am = torch.ones_like(ids)
    ids[1, :3] = 0
    am[1, :3] = 0
    return ids, am


def _same_until_eos(got, ref):
    compared = 0
    for b in range(ref.shape[0]):
        row = ref[b].tolist()
        n = row.index(2) + 1 if 2 in row else len(row)
        assert got[b, :n].tolist() == row[:n], (b, got[b].tolist(), row)
        compared += n
    return compared


@pytest.mark.parametrize("model_type", ["qwen3_next", "mamba2", "falcon_h1", "lfm2", "nemotron_h"])
def test_compiled_decode_equals_generate_for_two_prompts(folder, model_type):
    model = AutoModelForCausalLM.from_pretrained(folder(model_type)).eval()
    own = arch.own_cache_class(model)
    if own:
        pytest.skip(f"this transformers keeps {own} for {model_type} (refused in one line)")
    runner = DecodeStepRunner(model, batch_size=2, max_cache_len=MAX_LEN, backend="compile")
    compared = 0
    for seed in (0, 1):
        ids, am = _prompts(seed)
        ref = model.generate(
            ids, attention_mask=am, do_sample=False, max_new_tokens=NEW, pad_token_id=0
        )[:, ids.shape[1] :]
        got = runner.generate(ids, am, max_new_tokens=NEW)
        compared += _same_until_eos(got, ref)
    assert compared >= 2 * NEW  # most of both prompts' tokens, both rows
    kinds = set(runner.cache.kinds)
    assert kinds & {"state", "hybrid"}
    if model_type == "falcon_h1":
        assert kinds == {"hybrid"}
    if model_type == "nemotron_h":
        assert "none" in kinds  # MLP / MoE blocks hold nothing
    runner.close()


def test_describe_names_states_and_counts_their_bytes(folder):
    model = AutoModelForCausalLM.from_pretrained(folder("qwen3_next")).eval()
    runner = DecodeStepRunner(model, batch_size=1, max_cache_len=MAX_LEN, backend="eager")
    runner.prefill(torch.randint(3, 250, (1, 6)))
    info = runner.cache.describe()
    cfg = model.config
    linear = [e for e in info["layers"] if e["kind"] == "state"]
    full = [e for e in info["layers"] if e["kind"] == "attention"]
    assert [e["type"] for e in linear] == ["linear_attention"]
    assert [e["type"] for e in full] == ["full_attention"]
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    conv_dim = 2 * nk * dk + nv * dv
    assert linear[0]["states"] == {
        "conv_state": [[1, conv_dim, cfg.linear_conv_kernel_dim]],
        "recurrent_state": [[1, nv, dk, dv]],
    }
    state = 4 * (conv_dim * cfg.linear_conv_kernel_dim + nv * dk * dv)
    assert info["state_bytes"] == linear[0]["state_bytes"] == state
    kv = 2 * cfg.num_key_value_heads * MAX_LEN * cfg.head_dim * 4
    assert info["kv_bytes"] == full[0]["bytes"] == kv
    assert info["total_bytes"] == runner.cache.nbytes() == kv + state
    # Masks under every name the model may read: the attention type, and None for the
    # recurrent type (a one-token step carries no padding).
    masks = runner.cache.decode_masks(torch.float32)
    assert masks["linear_attention"] is None
    assert masks["full_attention"].shape == (1, 1, 1, MAX_LEN)


def test_state_buffers_keep_their_address_across_prompts(folder):
    model = AutoModelForCausalLM.from_pretrained(folder("mamba2")).eval()
    runner = DecodeStepRunner(model, batch_size=1, max_cache_len=MAX_LEN, backend="eager")
    runner.prefill(torch.randint(3, 250, (1, 6)))
    before = [t.data_ptr() for t in runner.cache.state_tensors()]
    first = [t.clone() for t in runner.cache.state_tensors()[1:]]
    runner.reset()
    runner.prefill(torch.randint(3, 250, (1, 6)))
    assert [t.data_ptr() for t in runner.cache.state_tensors()] == before
    after = runner.cache.state_tensors()[1:]
    assert any(not torch.equal(a, b) for a, b in zip(first, after, strict=True))


def test_hybrid_layer_masks_under_the_names_the_model_reads(folder):
    model = AutoModelForCausalLM.from_pretrained(folder("falcon_h1")).eval()
    runner = DecodeStepRunner(model, batch_size=1, max_cache_len=MAX_LEN, backend="eager")
    runner.prefill(torch.randint(3, 250, (1, 6)))
    masks = runner.cache.decode_masks(torch.float32)
    # Falcon-H1's layers are 'hybrid' and it reads causal_mask_mapping['full_attention'].
    assert masks["full_attention"] is masks["hybrid"]
    assert masks["linear_attention"] is None
    described = runner.cache.describe()["layers"][0]
    assert described["kind"] == "hybrid"
    assert described["kv_bytes"] > 0
    assert described["state_bytes"] > 0
    assert described["bytes"] == described["kv_bytes"] + described["state_bytes"]


@pytest.mark.parametrize(
    ("model_type", "words"),
    [
        ("minimax", "keeps a cache class of its own (MiniMaxCache)"),
        ("recurrent_gemma", "returned no cache object"),
    ],
)
def test_models_with_their_own_state_are_refused_in_one_line(folder, model_type, words):
    model = AutoModelForCausalLM.from_pretrained(folder(model_type)).eval()
    runner = DecodeStepRunner(model, batch_size=1, max_cache_len=MAX_LEN, backend="compile")
    with pytest.raises(UnsupportedModelError) as info:
        runner.prefill(torch.randint(3, 250, (1, 6)))
    assert words in str(info.value)
    assert "\n" not in str(info.value)
    assert "eager arm" in str(info.value)
