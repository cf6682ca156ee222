"""Loading the released formats strictly: FP8 blocks, MTP, bad folders (nothing written)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from pypto_models_minimax import MiniMaxConfigError, MiniMaxWeightsError
from pypto_models_minimax.loading import dequantize_fp8_blocks
from pypto_models_minimax.modeling import PyptoMiniMaxM3ForCausalLM, PyptoMiniMaxM27ForCausalLM
from pypto_testing.checkpoints import other_shard, poison, rewrite_shard, shard_of
from pypto_testing.minimax import fp8_block_dequantize, fp8_block_quantize, read_checkpoint


def test_fp8_blocks_dequantise_exactly_including_partial_edge_blocks():
    """A 200 x 300 matrix has a 2 x 3 grid of 128-blocks, the last ones partial: deriving the
    block size from the grid (200 / 2 = 100) would be wrong; the config's 128 is right."""
    w = torch.randn(200, 300) * 3
    q, scale = fp8_block_quantize(w)
    assert q.dtype == torch.float8_e4m3fn
    assert tuple(scale.shape) == (2, 3)
    got = dequantize_fp8_blocks(q, scale, (128, 128), torch.float32)
    assert torch.equal(got, fp8_block_dequantize(q, scale))
    assert (got - w).abs().max() < 0.1 * w.abs().max()
    with pytest.raises(ValueError, match=r"scale grid \[2, 2\] does not fit a \[200, 300\] weight"):
        dequantize_fp8_blocks(q, scale[:, :2], (128, 128), torch.float32)


def test_the_fp8_release_loads_dequantised_to_the_requested_dtype(m27_fp8):
    folder, _ = m27_fp8
    raw = read_checkpoint(folder)
    for dtype in (torch.float32, torch.bfloat16):
        model = PyptoMiniMaxM27ForCausalLM.from_pretrained(folder, dtype=dtype)
        assert {p.dtype for p in model.parameters()} == {dtype}
        report = model.pypto_load_report
        n_layers = model.config.num_hidden_layers
        scales = [
            k for k in raw if k.endswith("weight_scale_inv") and int(k.split(".")[2]) < n_layers
        ]
        assert report.dequantized == len(scales) == n_layers * (4 + 8 * 3)
        layer = model.model.layers[1]
        q = raw["model.layers.1.self_attn.q_proj.weight"]
        s = raw["model.layers.1.self_attn.q_proj.weight_scale_inv"]
        assert torch.equal(layer.self_attn.q_proj.weight, fp8_block_dequantize(q, s).to(dtype))
        w1 = raw["model.layers.1.block_sparse_moe.experts.5.w1.weight"]
        s1 = raw["model.layers.1.block_sparse_moe.experts.5.w1.weight_scale_inv"]
        w3 = raw["model.layers.1.block_sparse_moe.experts.5.w3.weight"]
        s3 = raw["model.layers.1.block_sparse_moe.experts.5.w3.weight_scale_inv"]
        gate_up = torch.cat([fp8_block_dequantize(w1, s1), fp8_block_dequantize(w3, s3)])
        assert torch.equal(layer.mlp.experts.gate_up_proj[5], gate_up.to(dtype))
        # the router and its score-correction bias are stored in float32 (not quantised)
        assert torch.equal(
            layer.mlp.gate.weight, raw["model.layers.1.block_sparse_moe.gate.weight"].to(dtype)
        )


def test_auto_dtype_of_the_fp8_release_is_bfloat16_and_mtp_is_skipped_with_a_note(m27_fp8, caplog):
    folder, _ = m27_fp8
    with caplog.at_level("INFO", logger="pypto_models_minimax"):
        model = PyptoMiniMaxM27ForCausalLM.from_pretrained(folder)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.pypto_load_report.mtp_tensors > 0
    assert "multi-token-prediction (MTP) tensors skipped" in caplog.text
    assert "dequantised from 128x128 blocks to bfloat16" in caplog.text
    assert not hasattr(model, "hf_quantizer") or model.hf_quantizer is None


def test_the_bf16_release_loads_too(m27_bf16):
    model = PyptoMiniMaxM27ForCausalLM.from_pretrained(m27_bf16, dtype="float32")
    raw = read_checkpoint(m27_bf16)
    assert model.pypto_load_report.dequantized == 0
    assert torch.equal(
        model.model.layers[0].mlp.experts.down_proj[2],
        raw["model.layers.0.block_sparse_moe.experts.2.w2.weight"].float(),
    )


def _break_missing_expert(folder):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    for key in (
        "model.layers.1.block_sparse_moe.experts.3.w3.weight",
        "model.layers.1.block_sparse_moe.experts.3.w3.weight_scale_inv",
    ):
        rewrite_shard(shard_of(folder, key), lambda t, key=key: t.pop(key))
        del index["weight_map"][key]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _break_shape(folder):
    key = "lm_head.weight"
    rewrite_shard(shard_of(folder, key), lambda t: t.update({key: t[key][:, :128].contiguous()}))


def _break_extra(folder):
    key = "model.layers.0.self_attn.o_proj.weight"
    rewrite_shard(
        shard_of(folder, key),
        lambda t: t.update({"model.layers.0.self_attn.o_bias": torch.zeros(3)}),
    )


def _break_scale(folder):
    key = "model.layers.0.self_attn.q_proj.weight_scale_inv"
    rewrite_shard(shard_of(folder, key), lambda t: t.update({key: t[key][:1].contiguous()}))


def _break_lost_scale(folder):
    key = "model.layers.0.self_attn.k_proj.weight_scale_inv"
    rewrite_shard(shard_of(folder, key), lambda t: t.pop(key))


def _break_duplicate(folder):
    """A zeroed copy of a tensor in the other shard: last-one-wins would load the zeros."""
    key = "model.layers.1.block_sparse_moe.gate.weight"
    value = torch.zeros_like(load_file(str(shard_of(folder, key)))[key])
    rewrite_shard(other_shard(folder, key), lambda t: t.update({key: value}))


def _break_scale_beside_bf16(folder):
    """The BF16 release's weight beside the FP8 release's scale: dequantising it anyway
    would scale an already dequantised weight again."""
    key = "model.layers.0.self_attn.q_proj.weight"
    scale = "model.layers.0.self_attn.q_proj.weight_scale_inv"

    def mix(t):
        t[key] = fp8_block_dequantize(t[key], t[scale]).to(torch.bfloat16)

    rewrite_shard(shard_of(folder, key), mix)


def _break_nan_scale(folder):
    poison(folder, "model.layers.1.self_attn.v_proj.weight_scale_inv", {(0, 0): float("nan")})


def _break_inf_weight(folder):
    # the router is stored in float32 in the FP8 release
    poison(folder, "model.layers.0.block_sparse_moe.gate.weight", {(2, 3): float("inf")})


def _break_integer_scale(folder):
    key = "model.layers.0.self_attn.o_proj.weight_scale_inv"
    rewrite_shard(shard_of(folder, key), lambda t: t.update({key: t[key].round().to(torch.int32)}))


def _break_missing_shard(folder):
    next(folder.glob("model-00002-of-*.safetensors")).unlink()


def _break_escaping_index(folder):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = "../outside.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _break_deep_index(folder):
    (folder / "model.safetensors.index.json").write_text("[" * 100_000 + "]" * 100_000)


def _break_header(folder):
    shard = next(folder.glob("model-00001-of-*.safetensors"))
    shard.write_bytes(b"\xff" * 64)


def _break_quant_method(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"]["quant_method"] = "gptq"
    (folder / "config.json").write_text(json.dumps(cfg))


BROKEN = [
    (_break_missing_expert, MiniMaxWeightsError, "lacks weights for layer 1", "expert 3's w3"),
    (_break_shape, MiniMaxWeightsError, "lm_head.weight is [259, 128] in the checkpoint", "config.json makes it [259, 256]"),
    (_break_extra, MiniMaxWeightsError, "does not describe", "o_bias"),
    (_break_scale, MiniMaxWeightsError, "q_proj.weight: scale grid [1, 2]", "FP8 checkpoint is damaged"),
    (_break_lost_scale, MiniMaxWeightsError, "model.layers.0.self_attn.k_proj.weight in model-0000", "is stored in F8_E4M3 without its weight_scale_inv"),
    (_break_duplicate, MiniMaxWeightsError, "weight model.layers.1.block_sparse_moe.gate.weight is stored twice (in model-00001-of-00002.safetensors and model-00002-of-00002.safetensors)", "re-download"),
    (_break_scale_beside_bf16, MiniMaxWeightsError, "model.layers.0.self_attn.q_proj.weight_scale_inv in model-0000", "which is stored in BF16, not FP8"),
    (_break_nan_scale, MiniMaxWeightsError, "weight model.layers.1.self_attn.v_proj.weight_scale_inv in model-0000", "1 non-finite value (NaN or inf)"),
    (_break_inf_weight, MiniMaxWeightsError, "weight model.layers.0.block_sparse_moe.gate.weight in model-0000", "1 non-finite value (NaN or inf)"),
    (_break_integer_scale, MiniMaxWeightsError, "model.layers.0.self_attn.o_proj.weight_scale_inv in model-0000", "is stored as I32, not a float"),
    (_break_missing_shard, MiniMaxWeightsError, "missing: the download is incomplete", "re-download"),
    (_break_escaping_index, MiniMaxWeightsError, "outside the folder", "re-download"),
    (_break_deep_index, MiniMaxWeightsError, "unreadable (RecursionError)", "re-download"),
    (_break_header, MiniMaxWeightsError, "not a readable safetensors file", "re-download"),
    (_break_quant_method, MiniMaxConfigError, "'gptq'/'float8_e4m3fn'", "use the FP8 or BF16 release"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("breaker", "error", "problem", "fix"), BROKEN, ids=[b[0].__name__ for b in BROKEN]
)
def test_a_broken_folder_is_one_line_and_nothing_is_written(
    m27_fp8, copy_of, snapshot, breaker, error, problem, fix
):
    folder = copy_of(m27_fp8[0])
    breaker(folder)
    before = snapshot(folder)
    with pytest.raises(error) as info:
        PyptoMiniMaxM27ForCausalLM.from_pretrained(folder)
    message = str(info.value)
    assert problem in message
    assert fix in message
    assert "\n" not in message
    assert snapshot(folder) == before


def test_not_a_folder_and_unknown_options_are_one_line(tmp_path, m3):
    with pytest.raises(MiniMaxConfigError, match="is not a local model folder"):
        PyptoMiniMaxM3ForCausalLM.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(MiniMaxConfigError, match=r"quantization_config.* not supported"):
        PyptoMiniMaxM3ForCausalLM.from_pretrained(m3, quantization_config={})


def test_m3_skips_the_vision_tower_and_reads_the_language_model_prefix(m3):
    model = PyptoMiniMaxM3ForCausalLM.from_pretrained(m3, dtype="float32")
    raw = read_checkpoint(m3)
    report = model.pypto_load_report
    assert report.vision_tensors == sum(
        1
        for k in raw
        if k.split(".")[0] in ("vision_tower", "multi_modal_projector", "patch_merge_mlp")
    )
    assert torch.equal(model.lm_head.weight, raw["language_model.lm_head.weight"].float())
    dense = model.model.layers[0].mlp.gate_up_proj.weight
    gate = raw["language_model.model.layers.0.mlp.gate_proj.weight"].float()
    up = raw["language_model.model.layers.0.mlp.up_proj.weight"].float()
    assert torch.equal(dense, torch.cat([gate, up]))
    assert torch.equal(
        model.model.layers[1].self_attn.indexer.k_proj.weight,
        raw["language_model.model.layers.1.self_attn.index_k_proj.weight"].float(),
    )
    assert model.pypto_sparse_layers == 2  # layers 1 and 2 (layer 0 is dense attention)


def test_a_pinned_overlay_loads_through_the_links_it_recorded_and_no_other(
    m27_bf16, tmp_path, snapshot
):
    """pypto-patch's overlay links the shards into the downloaded folder: those links are
    followed (the weights equal the folder's own), a link planted in their place is not."""
    from pypto_patch import apply

    overlay = tmp_path / "pinned"
    apply(m27_bf16, family="minimax_m27", output_dir=overlay)
    shard = next(overlay.glob("model-00001-of-*.safetensors"))
    assert shard.is_symlink()
    ours = PyptoMiniMaxM27ForCausalLM.from_pretrained(overlay, dtype="float32").state_dict()
    theirs = PyptoMiniMaxM27ForCausalLM.from_pretrained(m27_bf16, dtype="float32").state_dict()
    assert [k for k in theirs if not torch.equal(ours[k], theirs[k])] == []
    before = snapshot(m27_bf16)
    planted = tmp_path / shard.name
    planted.write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(planted)
    with pytest.raises(MiniMaxWeightsError) as info:
        PyptoMiniMaxM27ForCausalLM.from_pretrained(overlay, dtype="float32")
    assert f"shard {shard.name} in {overlay} is a symbolic link no pypto-patch overlay" in str(
        info.value
    )
    assert "\n" not in str(info.value)
    assert snapshot(m27_bf16) == before
