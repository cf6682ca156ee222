"""A deliberately failed CUDA capture. Kept in the last file (pytest runs files in name
order) so a device left unhappy by a broken capture cannot disturb the other tests."""

from __future__ import annotations

import pytest
import torch

from pypto_capture import CaptureFailedError, capture_and_replay

HAS_CUDA = torch.cuda.is_available()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (none visible to torch)")
def test_cudagraph_host_sync_maps_to_cuda_900():
    x = torch.ones(3, device="cuda")

    def step():
        return x * float(x.sum().item())

    with pytest.raises(CaptureFailedError) as exc:
        capture_and_replay(step, warmup=1, replays=1, backend="cudagraph", device="cuda:0")
    assert exc.value.explanation.code in ("900", "901"), exc.value.explanation
