"""Inside the captured step: a graph arm's kernels carry the modules that produced them.

Real compiles of real models on the CPU (the tiny Llama and a tiny Qwen3-MoE through
the bench's own graph arm, a planted slow module through pypto-capture's compile
backend); the replay matcher (CUDA / NPU graphs) on traces in the recorded formats.
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from pypto_capture.provenance import provenance_support
from pypto_tune import Thresholds, compare_profiles, diagnose, profile_model, to_markdown
from pypto_tune.graphmap import (
    Reference,
    attribute_captured,
    reference_from_trace,
    resolve_module_paths,
)
from pypto_tune.outputs import chrome_trace, layer_times
from pypto_tune.records import ROOT_SCOPE, OpEvent, OpStat, RawTrace, Span
from pypto_tune.summary import op_time, summarize

needs_provenance = pytest.mark.skipif(
    provenance_support() is not None, reason=str(provenance_support())
)
ATTRIBUTED = {"attention", "mlp", "norm", "rotary", "embedding", "lm_head", "experts", "other"}


def _attributed_us(prof) -> float:
    return sum(b["us"] for name, b in prof.blocks.items() if name in ATTRIBUTED)


def _check_whole_step(prof) -> None:
    """Every kernel of every graph call matched, and the breakdown adds up."""
    a = prof.meta["attribution"]
    assert a["status"] == "ok", a
    assert a["calls"] == prof.step["count"]  # one graph call per decode step
    assert a["kernels_matched"] == a["calls"] * sum(a["kernels_per_call"])
    trace = prof.trace
    inside = [e for e in trace.events if e.name.startswith("graph_") and e.kind == "op"]
    assert inside
    assert all(e.module for e in inside)
    fused = [e for e in trace.events if e.extra.get("fused_across")]
    assert fused
    assert all(len(e.extra["fused_across"]) > 1 for e in fused)
    total = sum(b["us"] for b in prof.blocks.values())
    assert total == pytest.approx(prof.step_us, rel=0.05)
    # Splitting a fused kernel keeps its time: the blocks hold what the kernels took.
    kernel_us = (
        sum(
            (e.self_us or 0.0)
            for e in trace.events
            if e.module and e.module != ROOT_SCOPE and e.kind == "op"
        )
        / prof.step["count"]
    )
    assert _attributed_us(prof) == pytest.approx(kernel_us, rel=0.05)
    # What capture could not place is small: the step's own glue outside the graph.
    assert prof.blocks.get("captured", {"us": 0.0})["us"] < 0.25 * _attributed_us(prof)


@needs_provenance
def test_a_graph_arm_profile_names_its_blocks_and_layers(graph_profile):
    prof = graph_profile
    _check_whole_step(prof)
    blocks = {k for k, v in prof.blocks.items() if v["us"] > 0}
    assert {"attention", "mlp", "norm", "lm_head"} <= blocks
    assert set(layer_times(prof)) == {0, 1}  # both decoder layers of the tiny Llama
    modules = {o.module for o in prof.ops if o.module}
    assert "model.layers.0.self_attn.q_proj" in modules
    assert "model.layers.1.mlp.down_proj" in modules
    md = to_markdown(prof)
    assert "## Time by layer" in md
    assert "## Inside the captured step" in md
    assert "fused across modules" in md
    # The Chrome trace nests each kernel under its module's rebuilt range.
    trace = chrome_trace(prof)["traceEvents"]
    ranges = [e for e in trace if e.get("cat") == "module"]
    q = next(
        e for e in trace if e.get("args", {}).get("module") == "model.layers.0.self_attn.q_proj"
    )
    assert any(
        r["name"] == "model.layers.0.self_attn.q_proj" and r["ts"] <= q["ts"] < r["ts"] + r["dur"]
        for r in ranges
    )
    split = next(e for e in trace if e.get("args", {}).get("fused_across"))
    assert 0 < split["args"]["share"] < 1
    # Issue #45, item 3: a kernel fused across modules is drawn as its pieces laid end to
    # end over the kernel's own span (they all started at its start and overlapped).
    pieces: dict[tuple[str, float], list[dict]] = {}
    for e in trace:
        if e.get("args", {}).get("fused_across"):
            pieces.setdefault((e["name"], e["args"]["kernel_ts"]), []).append(e)
    assert pieces
    for (_name, start), group in pieces.items():
        group.sort(key=lambda e: e["ts"])
        assert group[0]["ts"] == start
        for a, b in itertools.pairwise(group):
            assert abs(a["ts"] + a["dur"] - b["ts"]) < 1e-6, group  # end to end, no overlap
        assert abs(sum(g["share"] for g in (x["args"] for x in group)) - 1) < 1e-6
    cost = prof.meta["attribution"]["cost"]
    assert cost["compile_s"] > 0
    assert "outside the profiled steps" in cost["note"]


@needs_provenance
def test_eager_vs_graph_shows_where_capture_saved_time(eager_profile, graph_profile):
    c = compare_profiles(eager_profile, graph_profile)
    blocks = c["blocks"]
    # Norms and rotary are many small operators eagerly and a few fused kernels captured.
    for name in ("norm", "rotary"):
        assert blocks[name]["opt_us"] < 0.5 * blocks[name]["base_us"], (name, blocks[name])
    assert blocks["attention"]["opt_us"] > 0  # attention is still there, now attributed
    assert set(c["layers"]) == {"0", "1"}
    for layer in c["layers"].values():
        assert layer["opt_us"] < layer["base_us"]
    assert c["attribution"] == {"base": "module scopes", "opt": "attributed"}


@pytest.fixture(scope="module")
def moe_graph_profile(tmp_path_factory):
    from pypto_bench import BenchConfig
    from pypto_testing.models import make_tiny_model

    folder = make_tiny_model(
        tmp_path_factory.mktemp("tiny-moe"),
        "qwen3",
        model_type="qwen3_moe",
        architectures=["Qwen3MoeForCausalLM"],
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=1,
        norm_topk_prob=True,
    )
    cfg = BenchConfig(model_path=str(folder), device="cpu", regime="decode", seq=8, gen=6)
    return profile_model(cfg, arm="graph", level="light", iters=2, peaks=False)


@needs_provenance
def test_a_moe_graph_arm_charges_its_experts(moe_graph_profile):
    prof = moe_graph_profile
    _check_whole_step(prof)
    assert prof.blocks["experts"]["us"] > 0
    assert {"attention", "experts", "norm"} <= {k for k, v in prof.blocks.items() if v["us"] > 0}
    assert set(layer_times(prof)) == {0, 1}


class _Slow(nn.Module):
    """Batched matmuls with odd dims on the step's data: far below any matmul peak."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.randn(512, 33, 17))
        self.register_buffer("b", torch.randn(512, 17, 31))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.bmm(self.a * x.mean(), self.b).mean()


class _Layer(nn.Module):
    def __init__(self, slow: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.mlp = nn.Linear(64, 64)
        self.slow = _Slow() if slow else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mlp(self.norm(x))
        return self.slow(x) if self.slow is not None else x


class _Planted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Layer(slow=i == 2) for i in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@needs_provenance
def test_a_planted_slow_module_in_the_graph_arm_is_named():
    from pypto_capture import CompileBackend
    from pypto_capture.provenance import recording
    from pypto_tune import profile_step
    from pypto_tune.model import graph_attribution

    torch.manual_seed(0)
    model = _Planted().eval()
    x = torch.randn(1, 64)
    with torch.no_grad():
        with recording() as rec:
            step = CompileBackend(torch.device("cpu")).capture(lambda: model(x), warmup=1)
        prof = profile_step(
            step.replay,
            level="detail",
            iters=3,
            regime="prefill",
            attribution=graph_attribution(rec, model),
            peaks=True,
            dtype=torch.float32,
        )
    assert prof.meta["attribution"]["status"] == "ok", prof.meta["attribution"]
    top = prof.step["critical_path"]["top_ops"][0]
    assert top["module"] == "layers.2.slow"
    assert "bmm" in top["name"]
    always = Thresholds(matmul_efficiency=1e9, matmul_min_share=0.0, launch_bound_calls=0.0)
    found = next(f for f in diagnose(prof, always) if f["id"] == "matmul_efficiency")
    assert found["where"] == ["layers.2.slow"]
    assert found["evidence"]["batch_M_N_K"] == [512, 33, 31, 17]
    assert layer_times(prof)[2] == max(layer_times(prof).values())


def test_without_provenance_the_step_is_one_block_and_says_why(graph_profile):
    """A torch without inductor provenance (or a recorder that got nothing): the
    profile keeps the one ``captured`` block, with the reason in meta and warnings."""
    from pypto_capture.provenance import ProvenanceRecorder
    from pypto_tune.model import graph_attribution

    rec = ProvenanceRecorder()
    rec.unavailable = "torch 2.5.1 has no inductor provenance tracking"
    trace = copy.deepcopy(graph_profile.trace)
    for ev in trace.events:
        ev.module = None
    trace.modules = []
    classes, report = graph_attribution(rec, None)(trace)
    assert report["status"] == "fallback"
    assert "2.5.1" in report["why"]
    assert classes == {}
    assert not any(e.module for e in trace.events)


# -- replay matching on recorded-format traces (CUDA graph / NPU graph) --------------


def _kernel(name: str, t: float, dur: float = 2.0, module: str | None = None) -> OpEvent:
    return OpEvent(name, t, dur, device_us=dur, kind="kernel", thread=-1, module=module)


_SEQ = [
    ("void at::native::rms_norm_kernel<float>", "model.layers.0.input_layernorm"),
    ("ampere_sgemm_32x32_sliced1x4_tn", "model.layers.0.self_attn.q_proj"),
    ("flash_fwd_splitkv_kernel", "model.layers.0.self_attn"),
    ("ampere_sgemm_32x32_sliced1x4_tn", "model.layers.0.mlp.down_proj"),
]


def _eager_reference() -> Reference:
    """One profiled eager run: each kernel linked to its launching operator's module."""
    events = [_kernel(n, 10.0 * i, module=m) for i, (n, m) in enumerate(_SEQ)]
    return reference_from_trace(RawTrace(events, [], [], "cuda", "torch.profiler"))


def _replay(steps: int, drop: int | None = None) -> RawTrace:
    events, spans = [], []
    for s in range(steps):
        t0 = 1000.0 * s
        spans.append(Span("pypto_capture::step", t0, t0 + 900.0, 1))
        for i, (name, _) in enumerate(_SEQ):
            if drop is not None and s == 1 and i == drop:
                continue
            events.append(_kernel(name, t0 + 100.0 + 50.0 * i))
    return RawTrace(events, [], spans, "cuda", "torch.profiler")


def test_a_replay_carries_the_reference_modules_over():
    trace = _replay(3)
    report = attribute_captured(trace, [_eager_reference()])
    assert report["status"] == "ok"
    assert report["calls"] == 3
    assert report["kernels_matched"] == 12
    assert [e.module for e in sorted(trace.events, key=lambda e: e.start_us)][:4] == [
        m for _, m in _SEQ
    ]
    prof = summarize(trace, regime="decode")
    assert prof.blocks["attention"]["us"] == pytest.approx(4.0)  # q_proj + flash, per step
    assert prof.blocks["norm"]["us"] == pytest.approx(2.0)
    assert sum(op_time(o, "cuda") for o in prof.ops) == pytest.approx(8.0)


def test_a_replay_that_differs_is_not_guessed():
    trace = _replay(3, drop=2)
    report = attribute_captured(trace, [_eager_reference()])
    assert report["status"] == "fallback"
    assert "call 2" in report["why"]
    assert "flash_fwd_splitkv_kernel" in report["why"]
    assert not any(e.module for e in trace.events)
    assert trace.modules == []


def test_an_npu_replay_folder_is_attributed_from_an_eager_folder(tmp_path: Path):
    """Two torch_npu folders in the documented layout: an eager run whose kernels reach
    their modules by async_npu flows, and a graph replay whose kernels have no flow."""
    from test_npu import KERNEL_HEADER, KERNELS, _csv, trace_events, write_profile

    from pypto_tune.npu import read_ascend_output

    eager = read_ascend_output(write_profile(tmp_path / "eager"))
    ref = reference_from_trace(eager)
    linked = [m for _, ((m, _),) in ref.kernels]
    assert "model.layers.0.mlp.down_proj" in linked
    events = [e for e in trace_events() if e.get("cat") != "async_npu"]  # replay: no flows
    replay_dir = write_profile(tmp_path / "replay", events=events)
    replay = read_ascend_output(replay_dir)
    assert not any(e.module for e in replay.events if e.kind == "kernel")
    report = attribute_captured(replay, [ref])
    assert report["status"] == "ok", report
    by_name = {e.name: e.module for e in replay.events if e.kind == "kernel"}
    matmul = next(n for n in by_name if "MatMul" in n)
    assert by_name[matmul] == "model.layers.0.mlp.down_proj", by_name
    # A replay with one kernel more than the reference is refused, naming it.
    rows = [*KERNELS, [*KERNELS[0][:8], "1500.0", *KERNELS[0][9:]]]
    extra = tmp_path / "extra"
    write_profile(extra, events=events)
    out = next(extra.iterdir()) / "ASCEND_PROFILER_OUTPUT"
    _csv(out / "kernel_details.csv", KERNEL_HEADER, rows)
    report = attribute_captured(read_ascend_output(out.parent), [ref])
    assert report["status"] == "fallback"
    assert "MatMul" in report["why"], report["why"]


def test_module_paths_resolve_onto_the_model_and_nowhere_else():
    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2)])

    model = Inner()
    got = resolve_module_paths(
        {
            "model.layers.0": "Linear",  # the runner's attribute first
            "layers.0": "Linear",
            "model.layers.0.x": "Linear",  # no such module
            "layers.0/../../etc": "Linear",
            "": "Inner",
            "layers.0 ": "Conv2d",  # the class must match too
        },
        model,
    )
    assert got["model.layers.0"] == "layers.0"
    assert got["layers.0"] == "layers.0"
    assert got["model.layers.0.x"] == ROOT_SCOPE
    assert got["layers.0/../../etc"] == ROOT_SCOPE
    assert got[""] == ROOT_SCOPE
    assert got["layers.0 "] == ROOT_SCOPE


def test_a_hostile_attribution_in_a_profile_file_is_clipped_or_refused(tmp_path, graph_profile):
    from pypto_tune.errors import ProfileFormatError
    from pypto_tune.outputs import load_profile, write_profile

    prof = copy.deepcopy(graph_profile)
    prof.meta["attribution"] = {
        "status": "fallback",
        "why": "<script>alert(1)</script>" * 5000,
        "cost": {"compile_s": "soon"},
    }
    path = write_profile(prof, tmp_path / "hostile.json")
    loaded = load_profile(path)
    md = to_markdown(loaded)
    line = next(x for x in md.splitlines() if x.startswith("Not attributed"))
    assert len(line) < 300
    c = compare_profiles(loaded, graph_profile)
    assert len(c["attribution"]["base"]) < 300
    prof.meta["attribution"] = {"status": 5, "calls": "many"}
    path = write_profile(prof, tmp_path / "wrong.json")
    with pytest.raises(ProfileFormatError, match="attribution"):
        load_profile(path)


def test_compare_cli_draws_eager_and_graph_side_by_side(
    tmp_path, eager_profile, graph_profile, capsys
):
    from pypto_tune import EXIT, write_profile
    from pypto_tune.cli import main

    base = write_profile(eager_profile, tmp_path / "eager.json")
    opt = write_profile(graph_profile, tmp_path / "graph.json")
    png = tmp_path / "side-by-side.png"
    assert main(["compare", str(base), str(opt), "--plot", str(png), "--json"]) == EXIT.OK
    out = json.loads(capsys.readouterr().out)
    assert out["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["layers"]["0"]["opt_us"] < out["layers"]["0"]["base_us"]
    # Into a folder that cannot exist: one line, the write-failed code, nothing else.
    bad = tmp_path / "eager.json" / "x.png"
    assert main(["compare", str(base), str(opt), "--plot", str(bad)]) == EXIT.WRITE_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "x.png" in err[0]


def _sdpa(us: float) -> OpStat:
    """An attention kernel moving 80 MB per step: at 100 GB/s that is 800 us of reads."""
    return OpStat(
        name="aten::_scaled_dot_product_flash_attention_for_cpu",
        module="model.layers.0.self_attn",
        block="attention",
        layer=0,
        calls=1.0,
        host_us=us,
        self_us=us,
        device_us=us,
        bytes=8e7,
    )


def test_the_attention_kernel_is_advised_only_where_attention_holds_the_step():
    """The same memory-bound attention kernel: 40% of an eager step (advised), 4% of a
    captured step whose own breakdown is mostly matmuls (not the next fix there)."""
    from constructed import make_profile, matmul_op

    from pypto_tune import advise

    eager = advise(make_profile([_sdpa(1000.0)], step_us=2500.0))
    assert "attention_memory_bound" in {f["id"] for f in eager.findings}
    assert any(r["id"] == "fused_attention" for r in eager.recommendations)
    big = matmul_op(4096, 4096, 4096, us=20000.0)
    graph = advise(make_profile([_sdpa(1000.0), big], step_us=25000.0, arm="graph"))
    assert "attention_memory_bound" not in {f["id"] for f in graph.findings}
    assert not any(r["id"] == "fused_attention" for r in graph.recommendations)
    lower = Thresholds(attention_min_share=0.01)
    assert "attention_memory_bound" in {f["id"] for f in diagnose(graph, lower)}


def test_a_cuda_reference_comes_from_the_kernels_each_operator_launched():
    """torch.profiler on CUDA lists each operator's kernels (``extra["kernels"]``, what
    collect keeps): the reference is that list in order, under the operator's module."""
    ops = [
        OpEvent("aten::mm", 10.0, 5.0, thread=1, module="model.layers.0.mlp.up_proj",
                extra={"kernels": ["ampere_sgemm_64x32_tn"]}),
        OpEvent("triton_poi_fused_mul_silu_0", 20.0, 3.0, thread=1, module="model.layers.0.mlp",
                extra={"kernels": ["triton_poi_fused_mul_silu_0"]}),
        OpEvent("aten::cat", 30.0, 2.0, thread=1, module=None,
                extra={"kernels": ["CatArrayBatchedCopy", "CatArrayBatchedCopy"]}),
    ]  # fmt: skip
    ref = reference_from_trace(RawTrace(ops, [], [], "cuda", "torch.profiler"))
    assert ref.keys == (
        "ampere_sgemm_64x32_tn",
        "triton_poi_fused_mul_silu_0",
        "CatArrayBatchedCopy",
        "CatArrayBatchedCopy",
    )
    assert [m[0][0] for _, m in ref.kernels] == [
        "model.layers.0.mlp.up_proj",
        "model.layers.0.mlp",
        ROOT_SCOPE,
        ROOT_SCOPE,
    ]
    replay = RawTrace(
        [_kernel(k, 100.0 + 10 * i) for i, k in enumerate(ref.keys)], [], [], "cuda", "x"
    )
    assert attribute_captured(replay, [ref])["status"] == "ok"
    assert replay.events[1].module == "model.layers.0.mlp"
