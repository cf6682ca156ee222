"""pypto_capture.weights: the value checks every strict family loader shares."""

from __future__ import annotations

import pytest
import torch

from pypto_capture import weights
from pypto_capture.weights import count_non_finite


def test_non_finite_values_are_counted_in_every_floating_dtype(monkeypatch):
    t = torch.ones(5, 7)
    t[1, 2] = float("nan")
    t[4, 6] = float("-inf")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert count_non_finite(t.to(dtype)) == 2
    fp8 = torch.ones(3, 3).to(torch.float8_e4m3fn)
    fp8[0, 0] = float("nan")  # e4m3fn has NaN but no inf
    assert count_non_finite(fp8) == 1
    assert count_non_finite(torch.full((4,), 7, dtype=torch.int32)) == 0
    monkeypatch.setattr(weights, "_CHUNK", 4)  # bad values across chunk edges
    assert count_non_finite(t) == 2


def test_a_nan_tensor_is_one_line_naming_it_and_its_shard(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    from pypto_common.checkpoint import CheckpointError, read_checkpoint

    bad = torch.zeros(2, 2)
    bad[1, 1] = float("inf")
    safetensors.save_file(
        {"a.weight": torch.ones(2), "b.weight": bad}, str(tmp_path / "model.safetensors")
    )
    seen = []

    def read_all():
        for entry, tensor in weights.iter_tensors(read_checkpoint(tmp_path)):
            seen.append((entry.name, tensor.shape))

    with pytest.raises(CheckpointError) as info:
        read_all()
    assert seen == [("a.weight", torch.Size([2]))]
    assert str(info.value) == (
        "weight b.weight in model.safetensors holds 1 non-finite value (NaN or inf): the "
        "download is damaged; re-download the model"
    )
