"""tools/bench_attention_costmodel.py and the cost-model comparison behind it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[3] / "tools" / "bench_attention_costmodel.py"


def _tool():
    spec = importlib.util.spec_from_file_location("bench_attention_costmodel", TOOL)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    "argv",
    [["--heads", "3", "--kv-heads", "2"], ["--slots", "100"], ["--head-dim", "0"]],
)
def test_bad_shapes_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        _tool().main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "must be" in err


@pytest.mark.slow
def test_reduced_comparison_prints_fused_and_the_three_eager_kernels(capsys):
    pytest.importorskip("pypto")
    rc = _tool().main(
        ["--heads", "4", "--kv-heads", "2", "--slots", "64", "--head-dim", "64", "--json"]
    )
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["shapes"] == "reduced"
    names = [r["kernel"] for r in data["rows"]]
    assert names[0] == "gqa_decode (fused)"
    assert len(names) == 5
    assert all(r["sim_us"] > 0 for r in data["rows"])
    split = sum(r["sim_us"] for r in data["rows"][1:4])
    assert data["rows"][-1]["sim_us"] == pytest.approx(split)
