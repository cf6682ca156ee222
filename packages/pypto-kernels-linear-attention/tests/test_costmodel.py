"""The cost-model builder and tools/bench_linear_attention_costmodel.py: bad requests are
one-line errors; the chain lists eager's operators; the tool runs end to end at a tiny
shape and prints the fused step, every chain stage and their ratio."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from pypto_kernels_common import CostModelError, Tiles
from pypto_kernels_linear_attention.costmodel import (
    CHAINS,
    KERNELS,
    STAGE_OPS,
    chain,
    check_shape,
    io_bytes,
    row_group,
    stage_tiling,
    state_bytes,
)

TOOL = Path(__file__).resolve().parents[3] / "tools" / "bench_linear_attention_costmodel.py"
QWEN35_9B = {"batch": 1, "k_heads": 16, "v_heads": 32, "dk": 128, "dv": 128}
TINY = "k_heads=2,v_heads=4,dk=16,dv=16"


def _tool():
    spec = importlib.util.spec_from_file_location("bench_linear_attention_costmodel", TOOL)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    ("kernel", "shape", "dtype", "message"),
    [
        ("gated_delta", {}, "bf16", "unknown kernel 'gated_delta'; choose one of"),
        (
            "gated_delta_step",
            {"batch": 1},
            "bf16",
            "gated_delta_step shape lacks k_heads, v_heads, dk, dv",
        ),
        ("kda.state_add", {"batch": 1, "heads": 2}, "bf16", "kda.state_add shape lacks dim"),
        ("kda_step", {"batch": 1, "heads": 2, "dim": 16}, "int8", "unknown dtype 'int8'"),
        (
            "gated_delta.outer",
            {"batch": 1, "k_heads": 3, "v_heads": 4, "dk": 16, "dv": 16},
            "bf16",
            r"v_heads \(4\) must be a multiple of k_heads \(3\)",
        ),
        ("kda_step", {"batch": 0, "heads": 2, "dim": 16}, "bf16", "batch must be >= 1"),
    ],
)
def test_bad_requests_are_one_line_errors(kernel, shape, dtype, message):
    with pytest.raises(CostModelError, match=message) as exc:
        check_shape(kernel, shape, dtype)
    assert "\n" not in str(exc.value)


def test_the_chain_is_eagers_launches():
    stages = chain("gated_delta_step", QWEN35_9B, "bf16")
    assert stages == CHAINS["gated_delta_step"]
    assert set(stages) <= set(KERNELS)
    # every operator over the state is its own launch
    state = [s for s in stages if stage_tiling(s) == "state"]
    assert [s.partition(".")[2] for s in state] == [
        "state_decay",
        "state_k",
        "kv_mem",
        "outer",
        "state_add",
        "state_q",
        "readout",
    ]
    assert sum(STAGE_OPS[s][1] for s in stages) == 48
    # no launch in eager: fp32 casts, repeats at one value head per key head
    fp32 = chain("gated_delta_step", {**QWEN35_9B, "v_heads": 16}, "fp32")
    assert not {s.partition(".")[2] for s in fp32} & {"cast_v", "cast_beta", "cast_out"}
    assert not any("repeat" in s for s in fp32)
    assert len(chain("kda_step", {"batch": 1, "heads": 32, "dim": 128}, "bf16")) == 21


def test_tiles_and_bytes():
    assert stage_tiling("kda_step") == "state"
    assert stage_tiling("gated_delta.kv_mem") == "state"
    assert stage_tiling("gated_delta.rmsnorm") == "rows"
    assert stage_tiling("gated_delta.gate") is None  # one [B, Hv] row per task
    assert stage_tiling("kda.gate") == "rows"
    assert row_group(48, Tiles(rows=32)) == 24
    assert row_group(32, Tiles(rows=0)) == 1
    assert state_bytes(QWEN35_9B) == 32 * 128 * 128 * 4
    assert io_bytes("gated_delta_step", QWEN35_9B, "bf16") == 33664


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--models", "qwen9"], "unknown model 'qwen9'"),
        (["--shape", "heads=two"], "heads must be an integer"),
        (["--shape", "width=3"], "is not KEY=INT"),
        (["--batch", "0"], "batch must be >= 1"),
        (["--models", "qwen3_5_9b", "--shape", "k_heads=3"], "must be a multiple of k_heads"),
        (["--dtype", "int8"], "unknown dtype 'int8'"),
    ],
)
def test_tool_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    assert _tool().main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("bench_linear_attention_costmodel: ")
    assert message in err[0]


@pytest.mark.slow
def test_tool_runs_the_gated_delta_chain_at_a_tiny_shape(capsys):
    """Package default tiles: the fused step, all 23 stages, the sum and the ratio."""
    pytest.importorskip("pypto")
    rc = _tool().main(["--models", "qwen3_5_9b", "--shape", TINY, "--no-search", "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    (row,) = data["rows"]
    assert row["reduced"]
    assert row["shape"] == {"batch": 1, "k_heads": 2, "v_heads": 4, "dk": 16, "dv": 16}
    assert [s["stage"] for s in row["stages"]] == list(CHAINS["gated_delta_step"])
    assert all(s["sim_us"] > 0 for s in row["stages"])
    assert row["fused_us"] > 0
    assert row["chain_us"] == pytest.approx(sum(s["sim_us"] for s in row["stages"]))
    assert row["chain_over_fused"] == pytest.approx(row["chain_us"] / row["fused_us"])
    assert row["state_bytes_rw"] == 2 * 4 * 16 * 16 * 4


@pytest.mark.slow
def test_tool_prints_the_kda_tables_with_its_search(capsys):
    pytest.importorskip("pypto")
    assert _tool().main(["--models", "kimi_linear_48b_a3b", "--shape", "heads=2,dim=16"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    row = next(
        ln for ln in lines if ln.startswith("| Kimi-Linear-48B-A3B KDA | H 2, D 16 (reduced)")
    )
    assert "21 launches" in row
    assert re.search(r"\| \d+\.\d\dx \| (yes|no) \|$", row)  # chain / fused, >= 2x
    assert "| 16x16 | **" in out  # the one clipped state tile, marked best
    assert "| sigmoid_gate (4) |" in out
    assert "| **total** |" in out
