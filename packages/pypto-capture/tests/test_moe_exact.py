"""Exact capture-safe MoE on transformers' real MoE models (tiny, fp32, random weights).

Greedy tokens through DecodeStepRunner (torch.compile, fullgraph, static shapes) equal
``generate``'s on Qwen3-MoE, Mixtral, MiniMax M2 and MiniMax M3 (shared expert, clamped
SwiGLU, dense first layer), batch 2 with left padding and batch 1; the experts' data-
dependent forward (transformers' "eager" experts: one_hot -> nonzero -> loop) does not
capture at all. The static proxy captures and differs by design.
"""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("transformers")

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from pypto_capture import (
    CaptureFailedError,
    DecodeStepRunner,
    PyptoCaptureError,
    apply_exact_moe,
    apply_moe_routing,
    apply_static_moe,
    capture_and_replay,
    exact_experts_forward,
    find_experts,
    moe_weight_bytes,
)

_COMMON = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=259,
    max_position_embeddings=128,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

# 8 experts, top-2 (top-3 for M2, whose real checkpoints route 8: the summation order of
# more than two contributions matters). Decode: tokens * k < experts -> the gather path.
MOE_CONFIGS: dict[str, dict] = {
    "qwen3_moe": dict(
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
    ),
    "mixtral": dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2),
    "minimax_m2": dict(
        intermediate_size=32, num_local_experts=8, num_experts_per_tok=3, rotary_dim=8
    ),
    "minimax_m3_vl_text": dict(
        intermediate_size=32,
        num_local_experts=8,
        num_experts_per_tok=2,
        dense_intermediate_size=64,
        shared_intermediate_size=32,
        rotary_dim=8,
        index_head_dim=16,
        mlp_layer_types=["dense", "sparse"],
        layer_types=["full_attention", "full_attention"],
    ),
}
# minimax_m3_vl ships from transformers 5.12 (pypto-capture supports 5.8 on).
HAS_M3 = importlib.util.find_spec("transformers.models.minimax_m3_vl") is not None
if not HAS_M3:  # pragma: no cover - the transformers_range session at 5.8
    del MOE_CONFIGS["minimax_m3_vl_text"]
ARCHS = list(MOE_CONFIGS)
NEW = 10
MAX_LEN = 32


def tiny_moe(arch: str, experts_implementation: str | None = None, seed: int = 0):
    cfg = AutoConfig.for_model(arch, **_COMMON, **MOE_CONFIGS[arch])
    torch.manual_seed(seed)
    kw = {"experts_implementation": experts_implementation} if experts_implementation else {}
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", **kw).eval()
    with torch.no_grad():  # wider than the init: distinct greedy tokens, real routing choices
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "norm" not in name:
                p.normal_(0.0, 0.2)
    return model


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Every DecodeStepRunner here compiles the same bound ``_step`` code object, and dynamo
    allows 8 compilations per code object per process: start and leave each test clean."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def moe_models():
    return {arch: tiny_moe(arch) for arch in ARCHS}


def _prompts(batch: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (batch, 9), generator=g)
    am = torch.ones_like(ids)
    if batch > 1:
        ids[1, :3] = 0  # left padding on the second row
        am[1, :3] = 0
    return ids, am


def _reference(model, ids, am):
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=am, do_sample=False, max_new_tokens=NEW, pad_token_id=0
        )
    return out[:, ids.shape[1] :]


def _assert_same_until_eos(got, ref):
    for b in range(ref.shape[0]):
        row = ref[b].tolist()
        n = row.index(2) + 1 if 2 in row else len(row)
        assert got[b, :n].tolist() == row[:n], f"row {b}:\n{got[b].tolist()}\n{row}"


@pytest.mark.parametrize("arch", ARCHS)
def test_captured_decode_equals_generate_batch2(moe_models, arch):
    model = moe_models[arch]
    ids, am = _prompts(2)
    ref = _reference(model, ids, am)
    with apply_exact_moe(model) as handle:
        assert handle.applied
        with DecodeStepRunner(
            model, batch_size=2, max_cache_len=MAX_LEN, backend="compile"
        ) as runner:
            got = runner.generate(ids, am, max_new_tokens=NEW)
    _assert_same_until_eos(got, ref)
    assert len(set(ref.reshape(-1).tolist())) > 3  # not one token repeated


def test_captured_decode_equals_generate_batch1(moe_models):
    model = moe_models["minimax_m2"]
    ids, am = _prompts(1)
    ref = _reference(model, ids, am)
    with (
        apply_exact_moe(model),
        DecodeStepRunner(model, batch_size=1, max_cache_len=MAX_LEN, backend="compile") as runner,
    ):
        got = runner.generate(ids, am, max_new_tokens=NEW)
    _assert_same_until_eos(got, ref)


@pytest.mark.parametrize("arch", ARCHS)
def test_eager_gather_step_equals_generate_batch1(moe_models, arch):
    """The same fixed-shape step without capture (the gather path run eagerly)."""
    model = moe_models[arch]
    ids, am = _prompts(1, seed=3)
    ref = _reference(model, ids, am)
    with (
        apply_exact_moe(model),
        DecodeStepRunner(model, batch_size=1, max_cache_len=MAX_LEN, backend="eager") as runner,
    ):
        got = runner.generate(ids, am, max_new_tokens=NEW)
    _assert_same_until_eos(got, ref)


def test_data_dependent_experts_do_not_capture_exact_ones_do():
    """transformers' eager experts (nonzero + a loop over the hit experts) break the graph;
    the same model with apply_exact_moe captures and decodes the same tokens."""
    model = tiny_moe("minimax_m2", experts_implementation="eager")
    ids, am = _prompts(1)
    ref = _reference(model, ids, am)
    runner = DecodeStepRunner(model, batch_size=1, max_cache_len=MAX_LEN, backend="compile")
    with pytest.raises(CaptureFailedError) as info:
        runner.generate(ids, am, max_new_tokens=NEW)
    assert info.value.explanation.matched
    runner.close()
    with (
        apply_exact_moe(model),
        DecodeStepRunner(model, batch_size=1, max_cache_len=MAX_LEN, backend="compile") as runner,
    ):
        got = runner.generate(ids, am, max_new_tokens=NEW)
    _assert_same_until_eos(got, ref)


def test_captured_prefill_uses_the_dense_scheme_and_matches_logits(moe_models):
    """A captured full-sequence forward (tokens * k >= experts) runs every expert under a
    device-side mask: logits within fp32 tolerance of the model's own, same argmax."""
    model = moe_models["minimax_m3_vl_text" if HAS_M3 else "mixtral"]
    ids, am = _prompts(2)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=am).logits
    with apply_exact_moe(model), torch.no_grad():
        result = capture_and_replay(
            lambda: model(input_ids=ids, attention_mask=am).logits,
            backend="compile",
            device="cpu",
            warmup=1,
            replays=1,
        )
    got = result.output
    valid = am.bool()
    torch.testing.assert_close(got[valid], ref[valid], atol=1e-4, rtol=1e-4)
    assert torch.equal(got[valid].argmax(-1), ref[valid].argmax(-1))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tokens", [1, 2, 9])
def test_exact_forward_matches_the_experts_loop(arch, tokens):
    """Unit level, both schemes (gather for 1-2 tokens, dense-masked for 9) against the
    experts' own data-dependent loop, at fp32 tolerance."""
    model = tiny_moe(arch, experts_implementation="eager")
    block = model.model.layers[-1].mlp
    hidden = torch.randn(tokens, _COMMON["hidden_size"], generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        bias = getattr(block, "e_score_correction_bias", None)  # MiniMax M2 keeps it on the block
        _, weights, index = block.gate(hidden) if bias is None else block.gate(hidden, bias)
        ref = block.experts(hidden, index, weights)
        got = exact_experts_forward(block.experts, hidden, index, weights)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_static_proxy_captures_and_differs_by_design(moe_models):
    model = moe_models["qwen3_moe"]
    ids, am = _prompts(1)
    ref = _reference(model, ids, am)
    with apply_static_moe(model, token_counts=(1,)) as handle:
        assert handle.routing == "static"
        with DecodeStepRunner(
            model, batch_size=1, max_cache_len=MAX_LEN, backend="compile"
        ) as runner:
            got = runner.generate(ids, am, max_new_tokens=NEW)
    assert got.shape == ref.shape
    assert not torch.equal(got, ref)  # every token to experts 0..k-1: not the model's output


def test_static_tables_missing_at_capture_time_say_so(moe_models):
    model = moe_models["mixtral"]
    ids, am = _prompts(2)
    with (
        apply_static_moe(model),
        DecodeStepRunner(model, batch_size=2, max_cache_len=MAX_LEN, backend="compile") as runner,
        pytest.raises(CaptureFailedError) as info,
    ):
        runner.generate(ids, am, max_new_tokens=3)
    assert "pass token_counts=(2,) to apply_static_moe" in str(info.value.__cause__)


def test_handle_undo_restores_the_models_forward(moe_models):
    model = moe_models["mixtral"]
    experts = model.model.layers[0].mlp.experts
    before = experts.forward
    handle = apply_exact_moe(model)
    assert handle.modules == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    assert "forward" in vars(experts)
    with pytest.raises(PyptoCaptureError, match="already runs exact"):
        apply_static_moe(model)
    handle.undo()
    assert "forward" not in vars(experts)
    assert experts.forward == before
    assert not handle.applied
    with pytest.raises(PyptoCaptureError, match="unknown MoE routing 'fast'"):
        apply_moe_routing(model, "fast")


def test_dense_model_gets_an_empty_handle():
    cfg = AutoConfig.for_model("qwen3", **{k: v for k, v in _COMMON.items()}, intermediate_size=128)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    handle = apply_exact_moe(model)
    assert not handle.applied
    assert handle.modules == []
    assert find_experts(model) == []
    assert moe_weight_bytes(model) is None


def test_weight_bytes_count_active_experts_only(moe_models):
    model = moe_models["minimax_m2"]
    infos = find_experts(model)
    assert [(i.num_experts, i.top_k) for i in infos] == [(8, 3), (8, 3)]
    per = 3 * 32 * 64 * 4  # gate + up + down of one expert, fp32
    assert {i.bytes_per_expert for i in infos} == {per}
    assert moe_weight_bytes(model, batch=1) == {
        "expert_bytes": 2 * 8 * per,
        "active_expert_bytes": 2 * 3 * per,
        "moe_layers": 2,
    }
    assert moe_weight_bytes(model, batch=4)["active_expert_bytes"] == 2 * 8 * per  # capped at E


def _has_npu() -> bool:
    npu = getattr(torch, "npu", None)
    try:
        return bool(npu is not None and npu.is_available())
    except Exception:
        return False


@pytest.mark.parametrize(
    ("device", "backend"),
    [
        pytest.param(
            "cuda",
            "cudagraph",
            marks=pytest.mark.skipif(
                not torch.cuda.is_available(), reason="needs a CUDA device (none visible to torch)"
            ),
        ),
        pytest.param(
            "npu",
            "npugraph",
            marks=pytest.mark.skipif(
                not _has_npu(), reason="needs an Ascend NPU with torch_npu (none here)"
            ),
        ),
    ],
)
def test_device_graph_decode_equals_generate(device, backend):
    """On a device, the real stream capture (torch.cuda / torch_npu graphs): no sort, no
    counts, no host read in the captured step, and the tokens of eager generate."""
    model = tiny_moe("minimax_m2").to(device)
    ids, am = _prompts(2)
    ids, am = ids.to(device), am.to(device)
    ref = _reference(model, ids, am).cpu()
    with (
        apply_exact_moe(model),
        DecodeStepRunner(model, batch_size=2, max_cache_len=MAX_LEN, backend=backend) as runner,
    ):
        got = runner.generate(ids, am, max_new_tokens=NEW).cpu()
    _assert_same_until_eos(got, ref)


def test_shared_experts_kept_as_stacks_are_not_taken_for_routed_ones():
    """Inkling keeps its shared experts as 3-D stacks too (gate/up/down, one slice per shared
    expert) but calls them with the router's ``gammas``: the layout alone matched them, and
    the replaced forward refused ``gammas`` (decode) / lacked ``top_k_index`` (prefill).
    The forward's signature is read: only the routed experts are replaced, and the model's
    logits are unchanged."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "InklingTextConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no Inkling")
    from transformers import InklingForCausalLM, InklingTextConfig

    config = InklingTextConfig(**{**_COMMON, "n_routed_experts": 4, "num_experts_per_tok": 2,
                                  "n_shared_experts": 1, "moe_intermediate_size": 32,
                                  "intermediate_size": 64})  # fmt: skip
    torch.manual_seed(0)
    model = InklingForCausalLM(config).eval()
    found = {i.name.rsplit(".", 1)[-1] for i in find_experts(model)}
    assert found == {"experts"}  # shared_experts is not a routed experts module
    ids = torch.randint(3, 250, (1, 6))
    with torch.no_grad():
        want = model(ids).logits
        handle = apply_exact_moe(model)
        try:
            got = model(ids).logits
        finally:
            handle.undo()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _routed_experts_signatures():
    """Every routed-experts forward in the installed transformers, read from its modeling
    files (no import): classes whose forward starts (hidden_states, top_k_index,
    top_k_weights). Returns {module.Class: ast.arguments}."""
    import ast
    from pathlib import Path

    import transformers

    found = {}
    for path in sorted((Path(transformers.__file__).parent / "models").glob("*/modeling_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "forward":
                    names = [a.arg for a in fn.args.args][1:4]
                    if names == ["hidden_states", "top_k_index", "top_k_weights"]:
                        found[f"{path.parent.name}.{cls.name}"] = fn.args
    return found


def test_the_replacement_takes_every_call_a_routed_experts_forward_takes():
    """Issue #44: the replacement must accept whatever the router hands the experts. Read
    off every routed-experts forward this transformers ships: each call its signature
    allows (every extra positional and keyword parameter) binds to the replacement."""
    import inspect

    from pypto_capture import apply_exact_moe, apply_static_moe

    signatures = _routed_experts_signatures()
    assert len(signatures) >= 10, sorted(signatures)  # 73 in transformers 5.25
    model = tiny_moe("qwen3_moe")
    for apply in (apply_exact_moe, apply_static_moe):
        with apply(model) as handle:
            experts = dict(model.named_modules())[handle.modules[0]]
            replacement = inspect.signature(vars(experts)["forward"])
            for where, args in signatures.items():
                extra_pos = [a.arg for a in args.args][4:]
                extra_kw = {a.arg: None for a in args.kwonlyargs}
                try:
                    replacement.bind(experts, "h", "i", "w", *[None] * len(extra_pos), **extra_kw)
                except TypeError as err:
                    raise AssertionError(f"{where}: {err}") from None


def test_a_call_with_more_than_the_routed_triple_runs_the_module_s_own_forward():
    """A family whose experts take one more keyword (Inkling's shared experts took
    `gammas`): the replaced forward hands such a call to the module's own forward, so its
    meaning is the module's and the numbers equal the native call."""
    from pypto_capture import apply_exact_moe

    model = tiny_moe("qwen3_moe")
    name = next(n for n, m in model.named_modules() if type(m).__name__.endswith("Experts"))
    experts = dict(model.named_modules())[name]
    cls = type(experts)
    assert experts.__class__.__module__.startswith("transformers.")

    class ScaledExperts(cls):  # type: ignore[misc, valid-type]
        def forward(self, hidden_states, top_k_index, top_k_weights, scale=None):
            out = super().forward(hidden_states, top_k_index, top_k_weights)
            return out if scale is None else out * scale

    experts.__class__ = ScaledExperts
    torch.manual_seed(0)
    h = torch.randn(3, model.config.hidden_size)
    n = experts.gate_up_proj.shape[0]
    idx = torch.tensor([[0, 1], [2, 3], [n - 1, 0]])
    w = torch.full((3, 2), 0.5)
    with torch.no_grad():
        want = experts(h, idx, w, scale=3.0)
        with apply_exact_moe(model):
            got = experts(h, idx, w, scale=3.0)
            plain = experts(h, idx, w)
        assert torch.allclose(got, want)
        assert torch.allclose(plain * 3.0, want, atol=1e-5)


def test_experts_with_weighted_parts_the_exact_forward_does_not_apply_are_refused():
    """Ergo's experts normalise each route with a per-expert RMSNorm (a child module with
    weights) inside their own forward: replacing that forward dropped it and the graph arm
    computed something else (KL 0.1). Refused in one line instead, nothing installed."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    from pypto_capture import UnsupportedModelError, apply_exact_moe
    from pypto_testing.zoo import zoo_config

    if "ergo" not in CONFIG_MAPPING:
        pytest.skip("this transformers has no ergo")
    model = AutoModelForCausalLM.from_config(zoo_config("ergo"))
    before = {n: type(m).forward for n, m in model.named_modules()}
    with pytest.raises(UnsupportedModelError, match="carries post_expert_norm with weights"):
        apply_exact_moe(model)
    assert all("forward" not in vars(m) for m in model.modules())
    assert {n: type(m).forward for n, m in model.named_modules()} == before
