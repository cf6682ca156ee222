"""Small random inputs of both step ops (importable under importlib mode via conftest)."""

from __future__ import annotations

import torch

__all__ = ["gdn_inputs", "kda_inputs"]


def gdn_inputs(bsz=1, hk=2, hv=4, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=1.0):
        return (torch.randn(*shape, generator=g) * std).to(dtype)

    return {
        "q": r(bsz, hk, d),
        "k": r(bsz, hk, d),
        "v": r(bsz, hv, d),
        "a": r(bsz, hv),
        "b": r(bsz, hv),
        "z": r(bsz, hv, d),
        "A_log": torch.rand(hv, generator=g) * 7 - 4.6,
        "dt_bias": r(hv),
        "norm_weight": 1 + r(d, std=0.1),
        "state": torch.randn(bsz, hv, d, d, generator=g) * 0.05,
    }


def kda_inputs(bsz=1, h=4, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=1.0):
        return (torch.randn(*shape, generator=g) * std).to(dtype)

    return {
        "q": r(bsz, h, d),
        "k": r(bsz, h, d),
        "v": r(bsz, h, d),
        "g_raw": r(bsz, h, d),
        "b": r(bsz, h),
        "gate": r(bsz, h, d),
        "A_log": torch.rand(1, 1, h, 1, generator=g) * 7 - 4.6,
        "dt_bias": torch.randn(h * d, generator=g),
        "norm_weight": 1 + torch.randn(d, generator=g) * 0.1,
        "state": torch.randn(bsz, h, d, d, generator=g) * 0.05,
    }
