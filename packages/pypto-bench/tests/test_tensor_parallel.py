"""pypto_bench.multi.tensor without launching: plans are parsed and refused in one line,
and the cut keeps exactly this rank's rows of every packed part (the numerical proof
across real ranks is in test_distributed_families)."""

from __future__ import annotations

import pytest
import torch

from pypto_bench.errors import NoTensorParallelPlanError
from pypto_bench.multi.tensor import check_plan, parse_plan, plan_of, shard_model


class _Cfg:
    num_attention_heads = 4
    num_key_value_heads = 2


class _Attn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.num_key_value_heads = 4, 2
        self.qkv = torch.nn.Linear(8, (4 + 2 + 2) * 3, bias=True)
        self.dense = torch.nn.Linear(12, 8, bias=True)


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = _Cfg()
        self.layers = torch.nn.ModuleList([_Attn(), _Attn()])
        self.experts = torch.nn.Module()
        self.experts.gate_up_proj = torch.nn.Parameter(torch.randn(3, 2 * 6, 8))
        self.experts.down_proj = torch.nn.Parameter(torch.randn(3, 8, 6))


PLAN = {
    "layers.*.qkv": "packed_colwise:num_attention_heads,num_key_value_heads,num_key_value_heads",
    "layers.*": "local_heads:num_heads,num_key_value_heads",
    "layers.*.dense": "rowwise",
    "experts.gate_up_proj": "packed_colwise",
    "experts.down_proj": "rowwise",
    "experts": "moe_tp_experts",
    "lm_head": "colwise",
}


def test_packed_parts_keep_each_rank_s_rows_in_order():
    torch.manual_seed(0)
    full = _Model()
    for rank in (0, 1):
        model = _Model()
        model.load_state_dict(full.state_dict())
        report = shard_model(model, PLAN, rank=rank, world=2)
        w = full.layers[0].qkv.weight.detach()
        q, k, v = w.split([12, 6, 6])
        want = torch.cat([q.chunk(2)[rank], k.chunk(2)[rank], v.chunk(2)[rank]])
        assert torch.equal(model.layers[0].qkv.weight, want)
        assert torch.equal(model.layers[0].qkv.bias, torch.cat(
            [b.chunk(2)[rank] for b in full.layers[0].qkv.bias.detach().split([12, 6, 6])]
        ))  # fmt: skip
        assert (model.layers[1].num_heads, model.layers[1].num_key_value_heads) == (2, 1)
        assert torch.equal(
            model.layers[0].dense.weight, full.layers[0].dense.weight.detach().chunk(2, 1)[rank]
        )
        assert model.layers[0].dense.bias is None  # added once after the sum, not per rank
        gu = full.experts.gate_up_proj.detach()
        gate, up = gu.chunk(2, dim=1)
        assert torch.equal(
            model.experts.gate_up_proj, torch.cat([gate.chunk(2, 1)[rank], up.chunk(2, 1)[rank]], 1)
        )
        assert torch.equal(
            model.experts.down_proj, full.experts.down_proj.detach().chunk(2, -1)[rank]
        )
        assert report.full_parameters == sum(p.numel() for p in full.parameters())
        assert report.unmatched == ["lm_head"]
        assert report.hooks == 2 + 1  # two rowwise all-reduces, one experts all-reduce


@pytest.mark.parametrize(
    ("plan", "words"),
    [
        ({"layers.*.qkv": "megatron_magic"}, "style 'megatron_magic' is not one of"),
        ({"layers.*.qkv": "packed_colwise:num_attention_heads,nope"}, "part 'nope'"),
        ({"experts.down_proj": "moe_tp_experts"}, "is a tensor"),
        ({"layers.*": "colwise"}, "not a Linear"),
    ],
)
def test_bad_plans_are_one_line(plan, words):
    with pytest.raises(NoTensorParallelPlanError, match=words) as info:
        shard_model(_Model(), plan, rank=0, world=2)
    assert "\n" not in str(info.value)


def test_split_that_does_not_divide_is_refused_before_launching():
    with pytest.raises(
        NoTensorParallelPlanError, match="num_key_value_heads = 2 is not divisible by --nproc 4"
    ):
        check_plan(PLAN, _Cfg(), 4)
    with pytest.raises(NoTensorParallelPlanError, match="not divisible by --nproc 5"):
        shard_model(_Model(), {"layers.*.dense": "rowwise"}, rank=0, world=5)


def test_patterns_match_whole_path_components():
    (rule,) = parse_plan({"layers.*.mlp.down_proj": "rowwise"})
    assert rule.regex.search("model.layers.12.mlp.down_proj")
    assert not rule.regex.search("model.layers.1.mlp.shared_experts.down_proj")
    assert not rule.regex.search("model.layers.x.mlp.down_proj")
    assert not rule.regex.search("model.xlayers.1.mlp.down_proj")


def test_the_plan_comes_from_the_class_not_the_instance():
    cfg = _Cfg()
    cfg.pypto_tp_plan = {"x": "colwise"}  # what transformers does with a config.json key
    assert plan_of(cfg) is None
    llada2 = pytest.importorskip("pypto_models_llada2")
    LLaDA2MoeConfig = llada2.LLaDA2MoeConfig

    assert plan_of(LLaDA2MoeConfig())["layers.*.attention.dense"] == "rowwise"


@pytest.mark.parametrize("family", ["llada2_moe", "minimax_m27", "minimax_m3"])
def test_every_family_plan_entry_matches_the_real_model(family, tmp_path):
    """A plan entry that matches nothing silently leaves a layer whole (correct but not
    sharded): every entry of the in-repo plans must hit the tiny real models (M3's dense
    MLP entries need a dense layer, which the tiny M3 has)."""
    pytest.importorskip("pypto_patch")
    from pypto_bench.loading import load_model
    from pypto_patch import apply

    if family == "llada2_moe":
        pytest.importorskip("pypto_models_llada2")
        from pypto_testing.llada2 import make_tiny_llada2 as make

        folder = make(tmp_path / "m")
    else:
        pytest.importorskip("pypto_models_minimax")
        from pypto_testing import minimax

        make = (
            minimax.make_tiny_minimax_m27
            if family == "minimax_m27"
            else minimax.make_tiny_minimax_m3
        )
        folder = make(tmp_path / "m", weights="float32")
    apply(folder, family=family)
    model = load_model(folder, device="cpu", dtype="float32", trust_remote_code=True).model
    plan = plan_of(model.config)
    assert plan
    report = shard_model(model, plan, rank=1, world=2)
    assert report.unmatched == []
    assert sum(p.numel() for p in model.parameters()) < 0.8 * report.full_parameters
