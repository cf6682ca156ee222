"""Shared fixtures. Tests never need an accelerator; CUDA/NPU tests skip with a reason."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _few_threads():
    # 2 shared cores: inductor's compile workers and intra-op threads fight otherwise.
    torch.set_num_threads(1)
    return


def has_cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


requires_cuda = pytest.mark.skipif(
    not has_cuda(), reason="needs a CUDA device (none visible to torch)"
)
