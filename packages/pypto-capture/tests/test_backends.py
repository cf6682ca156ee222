"""capture_and_replay on plain functions: real torch.compile on CPU, real graphs on CUDA."""

from __future__ import annotations

import os

import pytest
import torch

from pypto_capture import (
    CaptureFailedError,
    DeviceNotAvailableError,
    PyptoCaptureError,
    capture_and_replay,
    make_backend,
    resolve_backend_name,
)

HAS_CUDA = torch.cuda.is_available()


def _counter_step(device="cpu"):
    state = torch.zeros(4, device=device)
    out = torch.zeros(4, device=device)

    def step():
        state.add_(1.0)  # in-place: what a decode step does to its position
        out.copy_(state * 2.0)
        return out

    return state, step


@pytest.mark.parametrize("backend", ["compile", "eager"])
def test_replays_are_timed_individually_and_mutate_state(backend):
    state, step = _counter_step()
    res = capture_and_replay(step, warmup=2, replays=5, backend=backend, device="cpu")
    assert res.backend == backend
    assert len(res.times_s) == 5
    assert all(t > 0 for t in res.times_s)
    # compile runs the step during warmup; eager only in replays.
    calls = (2 if backend == "compile" else 0) + 5
    assert torch.equal(state, torch.full((4,), float(calls)))
    assert torch.equal(res.output, torch.full((4,), 2.0 * calls))
    assert res.to_dict()["times_s"] == res.times_s


def test_item_in_region_is_a_graph_break_failure():
    x = torch.ones(3)

    def step():
        if x.sum().item() > 2:  # host sync + data-dependent Python branch in the region
            return x * 2
        return x

    with pytest.raises(CaptureFailedError) as exc:
        capture_and_replay(step, warmup=1, replays=1, backend="compile", device="cpu")
    expl = exc.value.explanation
    assert expl.matched, expl
    assert expl.code == "graph_break", expl
    assert "item" in expl.message.lower() or "data-dependent" in expl.message.lower()


def test_shape_change_between_replays_is_reported():
    holder = {"x": torch.ones(4)}

    def step():
        return holder["x"] * 2.0

    captured = make_backend("compile", "cpu").capture(step, warmup=1)
    assert torch.equal(captured.replay(), torch.full((4,), 2.0))
    holder["x"] = torch.ones(5)  # a dynamic shape: a replay would need a new graph
    with pytest.raises(CaptureFailedError) as exc:
        captured.replay()
    assert exc.value.explanation.code == "dynamic_shape", exc.value.explanation


def test_backend_resolution_and_pairing():
    cpu = torch.device("cpu")
    assert resolve_backend_name("auto", cpu) == "compile"
    assert resolve_backend_name("auto", torch.device("cuda", 0)) == "fused"
    with pytest.raises(PyptoCaptureError, match="unknown backend"):
        resolve_backend_name("tensorrt", cpu)
    with pytest.raises(DeviceNotAvailableError, match="cuda"):
        make_backend("cudagraph", "cpu")
    with pytest.raises(PyptoCaptureError, match="replays"):
        capture_and_replay(lambda: None, replays=0, backend="eager", device="cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (none visible to torch)")
def test_cudagraph_capture_replay_and_pool_reuse():
    state, step = _counter_step("cuda")
    be = make_backend("cudagraph", "cuda:0")
    res = capture_and_replay(step, warmup=3, replays=4, backend=be)
    torch.cuda.synchronize()
    # warmup (3) runs on the side stream; capture itself does not execute; 4 replays.
    assert torch.equal(state.cpu(), torch.full((4,), 7.0))
    assert len(res.times_s) == 4
    pool = be._pool
    assert pool is not None
    _state2, step2 = _counter_step("cuda")
    capture_and_replay(step2, warmup=1, replays=1, backend=be)
    assert be._pool == pool  # second graph shares the first one's pool


def test_fused_backend_on_cpu_is_the_compiled_step():
    """CPU has no device graphs: the fused backend's compile stage is all of it."""
    from pypto_capture import FusedBackend

    state, step = _counter_step("cpu")
    be = make_backend("fused", "cpu")
    assert isinstance(be, FusedBackend)
    assert be.label == "fused (compile)"
    res = capture_and_replay(step, warmup=2, replays=3, backend=be)
    assert res.backend == "fused (compile)"
    assert torch.equal(state, torch.full((4,), 5.0))  # 2 warmup + 3 replays, each ran


def test_fused_backend_falls_back_to_the_plain_capture_when_compile_fails():
    """What ``auto`` does on CUDA, driven on CPU with a stand-in graph stage."""
    from pypto_capture import EagerBackend, FusedBackend

    x = torch.ones(3)

    def step():
        print("host side effect")  # a graph break: fullgraph compile refuses it
        return x * 2.0

    cpu = torch.device("cpu")
    strict = FusedBackend(cpu, graph_stage=EagerBackend(cpu))
    assert strict.stages == ("compile", "eager")
    with pytest.raises(CaptureFailedError):
        strict.capture(step, warmup=1)
    lenient = FusedBackend(cpu, fallback=True, graph_stage=EagerBackend(cpu))
    captured = lenient.capture(step, warmup=1)
    assert torch.equal(captured.replay(), torch.full((3,), 2.0))
    assert lenient.stages == ("eager",)
    assert lenient.label == "fused (eager)"
    assert "compile stage failed" in lenient.fallback_reason


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (none visible to torch)")
def test_fused_backend_on_cuda_captures_the_compiled_step():
    _state, step = _counter_step("cuda")
    be = make_backend("auto", "cuda:0")
    assert be.name == "fused"
    assert be.fallback
    res = capture_and_replay(step, warmup=2, replays=4, backend=be)
    torch.cuda.synchronize()
    assert res.backend == "fused (compile+cudagraph)", be.fallback_reason
    assert len(res.times_s) == 4


def _npu_skip_reason() -> str | None:
    from pypto_capture import npu_available

    if npu_available() or os.environ.get("PYPTO_REQUIRE_NPU") == "1":
        return None  # under `nox -s cann` a missing NPU must fail, not skip
    return "needs an Ascend NPU (torch_npu with torchair and a visible device)"


@pytest.mark.npu
@pytest.mark.skipif(_npu_skip_reason() is not None, reason=str(_npu_skip_reason()))
def test_fused_backend_on_npu_is_torchair_reduce_overhead():
    state, step = _counter_step("npu")
    be = make_backend("fused", "npu:0")
    assert be.label == "fused (torchair reduce-overhead)"
    res = capture_and_replay(step, warmup=2, replays=3, backend=be)
    assert len(res.times_s) == 3
    assert float(state.sum().cpu()) > 0


@pytest.mark.parametrize("backend", ["compile", "fused"])
def test_a_model_exception_in_the_compiled_step_is_carried_not_called_a_host_sync(backend):
    """dynamo wraps what the traced code raises in Unsupported("Observed exception"): the
    error keeps the real KeyError and does not blame a host sync."""
    x = torch.ones(4)
    masks = {"hybrid": torch.zeros(4)}  # a mask mapping without the key the "model" reads

    def step():
        return x + masks["full_attention"]

    with pytest.raises(CaptureFailedError) as exc:
        capture_and_replay(step, warmup=1, replays=1, backend=backend, device="cpu")
    err = exc.value
    assert (err.cause_type, err.cause_message) == ("KeyError", "'full_attention'")
    expl = err.explanation
    assert expl.code == "model_error", expl
    assert "the model's own code raised KeyError: 'full_attention' while being traced" in expl.cause
    assert "host sync" not in str(err)
    assert "KeyError: 'full_attention'" in str(err)
    assert expl.to_dict()["cause_message"] == "'full_attention'"


def test_a_graph_break_error_names_the_exception_under_it():
    x = torch.ones(3)

    def step():
        return x * 2 if x.sum().item() > 2 else x

    with pytest.raises(CaptureFailedError) as exc:
        capture_and_replay(step, warmup=1, replays=1, backend="compile", device="cpu")
    assert exc.value.explanation.code == "graph_break"
    assert exc.value.cause_type == "GuardOnDataDependentSymNode"
    assert "[underlying error: GuardOnDataDependentSymNode: " in str(exc.value)


def _generated_code(capture):
    """The step captured, and the inductor code it compiled to (inductor's own hook)."""
    from torch._inductor.utils import run_and_get_code

    step, code = run_and_get_code(capture)
    return step, "\n".join(code)


@pytest.mark.parametrize(("asked", "wrapper"), [(None, "cpp"), (False, "python")])
def test_the_cpu_compile_runs_inductor_s_cpp_wrapper_unless_told_not_to(asked, wrapper):
    """On CPU the compiled step's kernel calls are one C++ function (the default), or the
    Python module inductor generates otherwise; both compute eager's numbers."""
    torch._dynamo.reset()
    lin = torch.nn.Linear(16, 16)
    x = torch.randn(2, 16)
    with torch.no_grad():
        want = torch.relu(lin(x)) * 2 + 1
        backend = make_backend("compile", "cpu", cpp_wrapper=asked)
        assert backend.wrapper is None  # nothing compiled yet
        step, code = _generated_code(
            lambda: backend.capture(lambda: torch.relu(lin(x)) * 2 + 1, warmup=1)
        )
        torch.testing.assert_close(step.replay(), want)
    assert backend.wrapper == wrapper
    # The C++ wrapper's entry point is generated only in that mode.
    assert ("inductor_entry_impl" in code) == (wrapper == "cpp"), code[:2000]


def test_the_fused_backend_says_which_wrapper_its_compile_stage_used():
    torch._dynamo.reset()
    backend = make_backend("fused", "cpu")
    x = torch.randn(4, 4)
    step = backend.capture(lambda: x.sin() + 1, warmup=1)
    torch.testing.assert_close(step.replay(), x.sin() + 1)
    assert backend.wrapper == "cpp"
    assert make_backend("fused", "cpu", cpp_wrapper=False).compiler.cpp_wrapper is False


def test_a_step_the_cpp_wrapper_cannot_express_compiles_with_the_python_one(tmp_path):
    """A collective over an explicit process group (what a tensor-parallel rank traces):
    inductor's C++ wrapper cannot pass the group to the all-gather ("arg type Any is not
    yet supported by custom_op_wrapper"); the backend compiles with the Python wrapper,
    gets eager's numbers, and says why. A one-rank gloo group, so it runs in-process."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        group = dist.group.WORLD
        x, w = torch.randn(4, 8), torch.randn(8, 8)

        def step():
            y = x @ w
            dist.all_reduce(y, group=group)
            parts = [torch.empty_like(y)]
            dist.all_gather(parts, y.contiguous(), group=group)
            return torch.cat(parts, dim=-1) * 2

        torch._dynamo.reset()
        backend = make_backend("compile", "cpu", freezing=False)
        captured = backend.capture(step, warmup=1)
        torch.testing.assert_close(captured.replay(), (x @ w) * 2)
        assert backend.wrapper == "python"
        assert backend.wrapper_fallback is not None
        assert "C++ wrapper could not compile" in backend.wrapper_fallback
        assert "NotImplementedError" in backend.wrapper_fallback
        assert "\n" not in backend.wrapper_fallback
        # Told to use the Python wrapper, nothing falls back.
        torch._dynamo.reset()
        plain = make_backend("compile", "cpu", freezing=False, cpp_wrapper=False)
        plain.capture(step, warmup=1)
        assert (plain.wrapper, plain.wrapper_fallback) == ("python", None)
    finally:
        dist.destroy_process_group()


def test_a_graph_break_is_not_a_wrapper_failure_and_nothing_falls_back():
    """A graph break is no wrapper's fault: it fails as before, one capture failure."""
    torch._dynamo.reset()
    backend = make_backend("compile", "cpu")
    x = torch.randn(3)

    def step():
        if x.sum().item() > 1e9:  # a host sync: dynamo cannot capture it in one graph
            return x
        return x + 1

    with pytest.raises(CaptureFailedError):
        backend.capture(step, warmup=1)
    assert backend.wrapper_fallback is None
