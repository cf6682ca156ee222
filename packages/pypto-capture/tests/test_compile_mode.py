"""The decode runner's default compile mode: autotuned GEMVs only where they pay off."""

from __future__ import annotations

import torch

from pypto_capture import AUTOTUNE_MIN_WEIGHT_BYTES, default_compile_mode

CPU = torch.device("cpu")


def _weights(nbytes: int) -> torch.nn.Module:
    # meta tensors: the rule reads sizes only, so no memory is spent on a "large" model
    return torch.nn.Linear(nbytes // 4 // 1024, 1024, bias=False, device="meta")


def test_large_models_on_cpu_get_autotuned_gemvs():
    mode, why = default_compile_mode(_weights(AUTOTUNE_MIN_WEIGHT_BYTES), CPU)
    assert mode == "max-autotune-no-cudagraphs"
    assert "256 MiB" in why


def test_small_models_and_other_devices_keep_inductor_s_default():
    mode, why = default_compile_mode(_weights(AUTOTUNE_MIN_WEIGHT_BYTES - 4096), CPU)
    assert mode is None
    assert "launch-bound" in why
    mode, why = default_compile_mode(_weights(AUTOTUNE_MIN_WEIGHT_BYTES * 4), torch.device("meta"))
    assert mode is None
    assert "not CPU" in why
