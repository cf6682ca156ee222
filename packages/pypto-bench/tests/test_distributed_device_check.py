"""tools/device_check_distributed.py --dry-run: the GPU script's steps on CPU (gloo, 2
ranks, tiny Llama), results and summary in --out. One subprocess, two launches and one
pipeline run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_bench.multi import visible_devices

ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "device_check_distributed.py"

pytestmark = pytest.mark.skipif(visible_devices("cpu") < 2, reason="needs 2 CPU cores")


@pytest.mark.slow(
    reason="the device-check script end to end on CPU: every figure, --nproc runs included "
    "(230 s beside a second worker, ~2 min alone)"
)
def test_dry_run_writes_every_figure(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "WORK": str(tmp_path / "work")}
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--dry-run", "--out", str(out), "--budget-s", "400"],
        capture_output=True,
        text=True,
        env=env,
        timeout=450,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    prefill = json.loads((out / "prefill_05b.json").read_text())
    dist = prefill["distributed"]
    assert dist["nproc"] == 2
    assert dist["backend"] == "gloo"
    assert dist["agreement"]["ok"]
    assert prefill["config"]["seq"] == 8
    decode = json.loads((out / "decode_05b.json").read_text())
    assert [a["name"] for a in decode["arms"]] == ["eager", "graph"]
    assert all(a["token_match"]["rate"] == 1.0 for a in decode["arms"])
    summary = (out / "summary.md").read_text()
    assert "| prefill_05b | eager | 2 | gloo |" in summary
    assert "| decode_05b | graph | 2 | gloo |" in summary
    pipeline = json.loads((out / "pipeline_05b.json").read_text())
    assert pipeline["distributed"]["placement"] == "pipeline"
    assert pipeline["distributed"]["agreement"]["ok"]
    assert "| pipeline_05b | eager | 2 | pipeline |" in summary
    # Past one machine: two nodes on loopback, and one profile per rank with its summary.
    nodes = json.loads((out / "nodes_05b.json").read_text())["distributed"]
    assert (nodes["nnodes"], nodes["nproc"], nodes["agreement"]["ok"]) == (2, 2, True)
    assert "| nodes_05b | eager | 2 | gloo |" in summary
    ranks = json.loads((out / "ranks_05b" / "ranks.json").read_text())
    assert [r["rank"] for r in ranks["ranks"]] == [0, 1]
    assert all((out / "ranks_05b" / r["profile"]).is_file() for r in ranks["ranks"])
    assert "Per-rank profile" in summary
    assert "Straggler: rank" in summary
    assert not list(out.glob("*.safetensors"))  # model folders stay outside $OUT


def test_ranks_follow_the_head_counts():
    sys.path.insert(0, str(TOOL.parent))
    from device_check_distributed import ranks_for

    assert ranks_for(8, 2, 14) == 2  # Qwen2.5-0.5B: 2 KV heads
    assert ranks_for(8, 4, 28) == 4  # Qwen2.5-7B
    assert ranks_for(1, 4, 28) == 1
    assert ranks_for(3, 4, 28) == 2
