"""The NPU path end to end without an NPU: a torch_npu output folder in the documented
format goes through the same summary, detectors and advice as a CPU profile, and the
advice adds AOE's operator-tuning file and the msprof-analyze advisor's status."""

from __future__ import annotations

import json
from pathlib import Path

from test_npu import write_profile

from pypto_tune import advise, summarize
from pypto_tune.npu import read_ascend_output


def test_npu_folder_is_diagnosed_and_advised(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no msprof-analyze here
    folder = write_profile(tmp_path)
    trace = read_ascend_output(folder)
    prof = summarize(
        trace,
        regime="prefill",
        meta={"device_type": "npu", "dtype": "bfloat16", "profiler_output": str(folder)},
        # A device whose bandwidth makes this 90 MB matmul far slower than it could be.
        peaks={"matmul_flops_per_s": 3e14, "bandwidth_bytes_per_s": 1e13},
    )
    advise(prof)
    ids = {f["id"] for f in prof.findings}
    assert "aicpu_ops" in ids  # IndexPut on the AI CPU, 25 us > 20 us
    mm = next(f for f in prof.findings if f["id"] == "matmul_efficiency")
    assert mm["evidence"]["batch_M_N_K"] == [1, 1, 11008, 4096]
    assert mm["evidence"]["misaligned_dims"] == {"M": 1}
    assert mm["where"] == ["model.layers.0.mlp.down_proj"]  # through the async_npu flow
    cfg = Path(prof.meta["operator_tuning_config"])
    assert json.loads(cfg.read_text())["tune_ops_type"] == ["MatMulV2"]
    assert prof.meta["msprof_advisor"]["available"] is False
