"""Provenance of a compiled step: each kernel inductor generated, with the modules of
the operations fused into it, recorded from a real compile (no mapping made up here)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pypto_capture import CompileBackend
from pypto_capture.provenance import (
    SPLIT_RULE,
    GraphProvenance,
    active_recorder,
    build_graph,
    module_path,
    profiler_key,
    provenance_support,
    recorded_names,
    recording,
)

pytestmark = pytest.mark.skipif(provenance_support() is not None, reason=str(provenance_support()))


class _Norm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = _Norm(32)
        self.proj = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(self.norm(x))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Layer() for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture(scope="module")
def recorded():
    torch.manual_seed(0)
    net = _Net().eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        want = net(x)
        with recording() as rec:
            assert active_recorder() is rec
            backend = CompileBackend(torch.device("cpu"))
            step = backend.capture(lambda: net(x), warmup=1)
        assert active_recorder() is None
        # The recorded compile keeps inductor's Python wrapper (the CPU default is the C++
        # one): its per-kernel profiler ranges and kernel names are what is matched.
        assert backend.cpp_wrapper
        assert backend.wrapper == "python"
        got = step.replay()
    return rec, want, got


def test_recording_compiles_the_same_step_and_records_every_kernel(recorded):
    rec, want, got = recorded
    torch.testing.assert_close(got, want)  # the recorded compile computes the same thing
    assert rec.errors == []
    assert rec.unavailable is None
    assert rec.compile_s > 0
    assert len(rec.graphs) == 1
    kernels = rec.graphs[0].kernels
    keys = [k.key for k in kernels]
    # Two projections (library matmuls), called in order, and generated kernels between.
    linear = [k for k in kernels if "::" in k.key]
    assert len(linear) == 2, keys
    assert [k.modules for k in linear] == [
        (("layers.0.proj", 1.0),),
        (("layers.1.proj", 1.0),),
    ]
    generated = [k for k in kernels if "::" not in k.key]
    assert generated
    assert all(k.key.startswith("cpp_fused") for k in generated)
    for k in kernels:
        assert k.modules
        assert sum(s for _, s in k.modules) == pytest.approx(1.0)
    # The first norm is a kernel of its own; a later one fuses the residual add of the
    # layer before it with its own operations: split, with both modules named.
    named = {m for k in generated for m, _ in k.modules}
    assert {"layers.0.norm", "layers.1.norm"} <= named
    assert any(k.fused_across for k in generated)
    assert rec.graphs[0].classes["layers.0.norm"] == "_Norm"
    assert "proportion" in SPLIT_RULE


def test_no_recording_no_provenance():
    """Outside recording() the compile is the plain one: no recorder, and no per-kernel
    profiler ranges in the generated code."""
    net = _Net().eval()
    x = torch.randn(2, 32)
    with torch.no_grad():
        step = CompileBackend(torch.device("cpu")).capture(lambda: net(x), warmup=1)
        with torch.profiler.profile() as prof:
            step.replay()
    assert active_recorder() is None
    assert not [e.name for e in prof.events() if e.name.startswith("graph_")]


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("L['self'].model.layers[0].self_attn", "model.layers.0.self_attn"),
        ("G['m']._modules['lm_head']", "lm_head"),
        ("L['self']", ""),
        ("L['self'].layers['3'].mlp", "layers.3.mlp"),
        ("self.model.norm", "model.norm"),
    ],
)
def test_module_paths_of_every_dynamo_spelling(raw, want):
    assert module_path(raw) == want


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("graph_3_cpp_fused_add_mean_0", "cpp_fused_add_mean_0"),
        ("cpp_fused_add_mean_0:17", "cpp_fused_add_mean_0"),
        ("torch.ops.mkl._mkl_linear.default:2", "mkl::_mkl_linear"),
        ("aten._scaled_dot_product_flash_attention_for_cpu.default", "aten::_scaled_dot_product_flash_attention_for_cpu"),
        ("extern_kernels.mm", "aten::mm"),
        ("aten::mm", "aten::mm"),
        ("triton_poi_fused_add_0", "triton_poi_fused_add_0"),
    ],
)  # fmt: skip
def test_profiler_keys(name, key):
    assert profiler_key(name) == key


class _G:
    """A graph with the attributes build_graph reads (nodes with meta)."""

    class _N:
        def __init__(self, name, meta):
            self.name, self.meta = name, meta

    def __init__(self, nodes):
        self.graph = type("g", (), {"nodes": [self._N(n, m) for n, m in nodes]})()


@pytest.mark.parametrize(
    "mapping",
    [
        {},
        {"postToPre": "not a dict", "cppCodeToPost": {"k:1": ["a"]}},
        {"postToPre": {"a": ["x"]}, "cppCodeToPost": {"k:notanumber": ["a"], "j": "x"}},
        {"postToPre": {"a": None}, "cppCodeToPost": {"k:1": ["a", "b"]}},
        {"cppCodeToPost": {"<script>:1": ["../../etc"] * 3}},
    ],
)
def test_a_malformed_mapping_yields_kernels_without_modules_never_an_error(mapping):
    g = build_graph(_G([("x", {"nn_module_stack": {"k": ("L['self'].a", nn.Linear)}})]), mapping)
    assert isinstance(g, GraphProvenance)
    for k in g.kernels:
        assert sum(s for _, s in k.modules) == pytest.approx(1.0)


def test_a_device_graph_stage_runs_the_reference_once_before_capturing():
    """The fused backend's graph stage (a stand-in here: CPU has no device graphs) hands
    the compiled step to the recorder's reference run first; a failing reference run is
    kept as an error and never breaks the capture."""
    from pypto_capture import EagerBackend, FusedBackend

    net = _Net().eval()
    x = torch.randn(2, 32)
    seen: list[object] = []

    def reference(fn):
        seen.append(fn())
        return "sequence"

    cpu = torch.device("cpu")
    with torch.no_grad():
        want = net(x)
        with recording(reference) as rec:
            step = FusedBackend(cpu, graph_stage=EagerBackend(cpu)).capture(lambda: net(x))
        assert rec.references == ["sequence"]
        assert len(seen) == 1
        torch.testing.assert_close(seen[0], want)
        torch.testing.assert_close(step.replay(), want)

        def broken(fn):
            raise RuntimeError("profiler unavailable")

        with recording(broken) as rec:
            step = FusedBackend(cpu, graph_stage=EagerBackend(cpu)).capture(lambda: net(x))
        assert rec.references == []
        assert "profiler unavailable" in rec.errors[0]
        torch.testing.assert_close(step.replay(), want)


def test_a_gemm_template_is_keyed_by_the_range_it_records_and_charged_to_its_matmul():
    """Inductor's C++ GEMM template (max-autotune's CPU choice on large weights) records
    its micro-kernel's name in the profiler, not its own: the recorded key is read from
    the output code, and the kernel, which fuses the next norm as its prologue, is the
    projection's (forced to the template here so the test does not autotune)."""
    import torch._inductor.config as inductor_config

    net = _Net().eval()
    x = torch.randn(1, 32)
    with torch.no_grad(), inductor_config.patch(max_autotune_gemm_backends="CPP"):
        with recording() as rec:
            backend = CompileBackend(torch.device("cpu"), mode="max-autotune-no-cudagraphs")
            step = backend.capture(lambda: net(x), warmup=1)
        with torch.profiler.profile() as prof:
            step.replay()
    kernels = rec.graphs[0].kernels
    templates = [k for k in kernels if k.key != profiler_key(k.kernel)]
    assert templates, [(k.kernel, k.key) for k in kernels]
    assert all(k.key.startswith("gemm_") for k in templates)
    assert [k.modules for k in templates] == [(("layers.0.proj", 1.0),), (("layers.1.proj", 1.0),)]
    recorded = [profiler_key(e.name) for e in prof.events() if e.name.startswith("graph_")]
    assert recorded == [k.key for k in kernels if "::" not in k.key]


def test_recorded_names_reads_only_what_the_code_defines():
    code = (
        "cpp_fused_a_0 = async_compile.cpp_pybinding(['float*'], r'''\n"
        "    torch::aot_inductor::RAIIAtenRecordFunctionHandle record_graph_0_cpp_fused_a_0_"
        '("graph_0_cpp_fused_a_0", nullptr);\n'
        "''')\n"
        "cpp_fused_b_1 = async_compile.cpp_pybinding(['float*'], r'''\n"
        "    torch::aot_inductor::RAIIAtenRecordFunctionHandle record_graph_0_gemm_m1_kernel_"
        '("graph_0_gemm_m1_kernel", nullptr);\n'
        "''')\n"
        "cpp_fused_c_2 = async_compile.cpp_pybinding(['float*'], r'''\n    no range here\n''')\n"
    )
    assert recorded_names(code) == {"cpp_fused_b_1": "gemm_m1_kernel"}
    assert recorded_names("") == {}
    assert recorded_names("x = async_compile.cpp_pybinding(" + '"' * 10000) == {}
