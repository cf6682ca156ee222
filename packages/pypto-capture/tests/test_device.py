"""Device layer: resolution, sync, memory counters (CPU here; CUDA where present)."""

from __future__ import annotations

import pytest
import torch

from pypto_capture import (
    DeviceNotAvailableError,
    InvalidDeviceSpecError,
    MemoryStats,
    device_name,
    memory_stats,
    npu_available,
    reset_peak_memory,
    resolve_device,
    synchronize,
)
from pypto_capture.device import new_stream

HAS_CUDA = torch.cuda.is_available()


def test_auto_prefers_accelerator_else_cpu():
    dev = resolve_device("auto")
    expected = "npu" if npu_available() else ("cuda" if HAS_CUDA else "cpu")
    assert dev.type == expected
    assert resolve_device(None) == dev
    assert resolve_device(0) == dev
    assert resolve_device("0") == dev


def test_explicit_cpu_and_device_objects():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")


@pytest.mark.skipif(HAS_CUDA, reason="checks the error for a missing CUDA device")
def test_missing_cuda_is_one_line_error():
    with pytest.raises(DeviceNotAvailableError) as exc:
        resolve_device("cuda:1")
    msg = str(exc.value)
    assert "\n" not in msg
    assert "cuda:1" in msg
    assert "cpu" in msg


@pytest.mark.skipif(npu_available(), reason="checks the error for a missing NPU")
def test_missing_npu_is_one_line_error():
    with pytest.raises(DeviceNotAvailableError) as exc:
        resolve_device("npu:0")
    assert "torch_npu" in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "tpu:0", "npu:-1"])
def test_unknown_spec_rejected(spec):
    # Its own type (a CLI answers "bad usage"), still a DeviceNotAvailableError for old handlers.
    with pytest.raises(InvalidDeviceSpecError, match="unknown device") as exc:
        resolve_device(spec)
    assert isinstance(exc.value, DeviceNotAvailableError)


def test_an_absent_device_is_not_a_bad_spec():
    if HAS_CUDA:
        pytest.skip("a CUDA device is present")
    with pytest.raises(DeviceNotAvailableError) as exc:
        resolve_device("cuda:0")
    assert not isinstance(exc.value, InvalidDeviceSpecError)


def test_cpu_memory_and_sync_are_zero_noops():
    cpu = torch.device("cpu")
    synchronize(cpu)
    reset_peak_memory(cpu)
    stats = memory_stats(cpu)
    assert stats == MemoryStats()
    assert stats.to_dict()["peak_reserved"] == 0
    assert device_name(cpu)
    with pytest.raises(DeviceNotAvailableError):
        new_stream(cpu)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (none visible to torch)")
def test_cuda_peak_memory_reset_and_growth():
    dev = resolve_device("cuda:0")
    assert "cuda" in str(dev)
    assert device_name(dev)
    reset_peak_memory(dev)
    base = memory_stats(dev)
    x = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device=dev)
    synchronize(dev)
    grown = memory_stats(dev)
    assert grown.peak_allocated >= base.peak_allocated + x.numel()
    assert grown.peak_reserved >= grown.peak_allocated
    del x
    torch.cuda.empty_cache()
    reset_peak_memory(dev)
    assert memory_stats(dev).peak_allocated < grown.peak_allocated


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (none visible to torch)")
def test_cuda_memory_calls_work_before_anything_touched_the_device():
    """A fresh process: resetting peaks is the first CUDA call (what a bench does)."""
    import subprocess
    import sys

    code = (
        "from pypto_capture import resolve_device, reset_peak_memory, memory_stats\n"
        "d = resolve_device('cuda:0'); reset_peak_memory(d); print(memory_stats(d).peak_allocated)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
