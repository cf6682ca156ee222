"""What max-autotune chose while a step compiled (real inductor compiles on the CPU: the
C++ GEMM template against MKL's packed linear), and a compile whose choice came from
inductor's caches."""

from __future__ import annotations

import torch
import torch._inductor.config as inductor_config

from pypto_capture import make_backend
from pypto_capture.autotune import autotune_log, kernel_kind


def _step() -> tuple[torch.nn.Module, object]:
    lin = torch.nn.Linear(96, 160).eval()
    x = torch.randn(1, 96)

    def step() -> torch.Tensor:
        return lin(x)

    return lin, step


def test_the_choices_of_an_autotuned_compile_are_recorded() -> None:
    _, step = _step()
    backend = make_backend("compile", "cpu", compile_mode="max-autotune-no-cudagraphs")
    with torch.inference_mode(), inductor_config.patch(force_disable_caches=True):
        backend.capture(step, warmup=1)
    tuned = backend.autotune
    assert tuned is not None
    assert tuned["recorded"] is True
    (op,) = tuned["ops"]
    assert op["shapes"][0] == [1, 96]
    assert op["shapes"][-1] == [160, 96]
    assert len(op["times_ms"]) >= 2  # every candidate timed, fastest first
    assert op["chosen"] == min(op["times_ms"], key=op["times_ms"].get)
    assert op["kind"] == kernel_kind(op["chosen"])
    assert all(t > 0 for t in op["times_ms"].values())


def test_a_compile_without_autotuning_records_nothing() -> None:
    _, step = _step()
    backend = make_backend("compile", "cpu", compile_mode="default")
    with torch.inference_mode():
        backend.capture(step, warmup=1)
    assert backend.autotune is None


def test_the_hook_sees_only_its_own_block() -> None:
    from torch._inductor import select_algorithm as sa

    before = list(sa.get_algorithm_selector_cache().feedback_saver_fns)
    with autotune_log() as seen:
        assert seen.saver in sa.get_algorithm_selector_cache().feedback_saver_fns
    assert sa.get_algorithm_selector_cache().feedback_saver_fns == before
    # A malformed call from a future inductor never raises into the compile.
    seen.saver("not a dict")
    assert seen.ops == []


def test_kernel_kind_drops_the_generated_index() -> None:
    assert kernel_kind("cpp_CppMicroGemmFP32Vec_12") == "cpp_CppMicroGemmFP32Vec"
    assert kernel_kind("_mkl_linear") == "_mkl_linear"
