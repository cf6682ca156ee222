"""--batch 1,2,...: every batch in one run, the roofline against both ceilings (issue #16)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from pypto_bench import EXIT, BadInputError, BenchConfig, schema
from pypto_bench.cli import main
from pypto_bench.measure import roofline
from pypto_bench.report import format_table, report_to_markdown


def _error_lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


@pytest.fixture(scope="session")
def sweep_report(tiny_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "sweep.json"
    code = main(
        [
            "run",
            "--model-path",
            str(tiny_llama),
            "--device",
            "cpu",
            "--batch",
            "1,2",
            "--seq",
            "8",
            "--gen",
            "8",
            "--warmup",
            "1",
            "--iters",
            "2",
            "--arms",
            "eager,graph",
            "--graph-backend",
            "eager",
            "--no-progress",
            "--report-file",
            str(out),
        ]
    )
    assert code == EXIT.OK
    return json.loads(out.read_text())


def test_sweep_gives_one_entry_per_batch_with_sane_figures(sweep_report):
    data = sweep_report
    jsonschema.validate(data, schema())
    assert data["config"]["batch"] == 1
    assert data["config"]["batches"] == [1, 2]
    sweep = data["batch_sweep"]
    assert [e["batch"] for e in sweep] == [1, 2]
    # The headline arms are the first batch's: a single-batch report's shape.
    assert [a["tokens_per_s"] for a in data["arms"]] == [
        a["tokens_per_s"] for a in sweep[0]["arms"]
    ]
    roofs = {}
    for entry in sweep:
        assert entry["ok"] is True
        assert [a["name"] for a in entry["arms"]] == ["eager", "graph"]
        for arm in entry["arms"]:
            assert arm["ok"], arm["error"]
            tps = arm["tokens_per_s"]
            assert len(tps["samples"]) == 2
            assert tps["best"] > 0
            roof = arm["roofline"]
            assert roof["binding"] in ("bandwidth", "compute")
            assert roof["ceiling_tok_s"] == min(
                roof["bandwidth_ceiling_tok_s"], roof["compute_ceiling_tok_s"]
            )
            assert 0 < roof["fraction_of_ceiling"] < 1
            roofs[(entry["batch"], arm["name"])] = roof
        graph = entry["arms"][1]
        assert graph["token_match"]["rate"] == 1.0  # each batch checked against its eager
        assert graph["ratio_to_eager"] == pytest.approx(
            graph["tokens_per_s"]["best"] / entry["arms"][0]["tokens_per_s"]["best"]
        )
        # Each batch's arms ran in their own interleaved rounds; its ratio has an interval.
        assert entry["schedule"]["kind"] == "interleaved"
        assert entry["schedule"]["order"] == [
            ["eager", 0],
            ["graph", 0],
            ["graph", 1],
            ["eager", 1],
        ]
        ratio = graph["ratio_vs_eager"]
        assert ratio["low"] <= ratio["median"] <= ratio["high"]
        assert ratio["rounds"] == 2
    for arm in ("eager", "graph"):
        one, two = roofs[(1, arm)], roofs[(2, arm)]
        # Twice the rows: twice the FLOPs per step, the same compute ceiling in tok/s;
        # the weights are read once per step, so the bandwidth ceiling nearly doubles.
        assert two["flops_per_step"] == pytest.approx(2 * one["flops_per_step"])
        assert two["compute_ceiling_tok_s"] == pytest.approx(one["compute_ceiling_tok_s"])
        assert 1.5 < two["bandwidth_ceiling_tok_s"] / one["bandwidth_ceiling_tok_s"] <= 2.0
    # One bandwidth / matmul measurement serves every batch.
    assert (
        sweep[0]["roofline"]["bandwidth_bytes_per_s"]
        == sweep[1]["roofline"]["bandwidth_bytes_per_s"]
    )
    assert data["roofline"]["matmul_flops_per_s"] > 0
    # The second batch ran its own prompt: two rows.
    assert len(sweep[1]["arms"][0]["memory"]["reserved_per_iter"]) == 2


def test_sweep_is_rendered_per_batch(sweep_report):
    table = format_table(sweep_report)
    assert "batch sweep" in table
    md = report_to_markdown(sweep_report)
    rows = [ln for ln in md.splitlines() if ln.startswith(("| 1 |", "| 2 |"))]
    assert len(rows) == 4  # 2 batches x 2 arms
    assert all("bandwidth" in r or "compute" in r for r in rows)
    # The graph rows' "x eager" is the paired ratio with its interval, as in the arms table.
    for batch, entry in zip(("| 1 |", "| 2 |"), sweep_report["batch_sweep"], strict=True):
        ratio = entry["arms"][1]["ratio_vs_eager"]
        row = next(r for r in rows if r.startswith(batch) and "| graph |" in r)
        assert f"{ratio['median']:.2f} [{ratio['low']:.2f}, {ratio['high']:.2f}]" in row


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("0", "--batch must be >= 1 (got 0)"),
        ("1,,2", "has an empty entry"),
        ("a", "entry 'a' is not an integer"),
        ("1,0", "--batch entries must be integers >= 1"),
        ("2,2", "batch listed twice"),
    ],
)
def test_bad_batch_lists_are_one_line_usage_errors(tiny_llama, tmp_path, capsys, value, needle):
    out = tmp_path / "r.json"
    code = main(
        [
            "run",
            "--model-path",
            str(tiny_llama),
            "--device",
            "cpu",
            "--batch",
            value,
            "--report-file",
            str(out),
        ]
    )
    assert code == EXIT.USAGE
    lines = _error_lines(capsys)
    assert len(lines) == 1, lines
    assert lines[0].startswith("pypto-bench: error:")
    assert needle in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_single_batch_keeps_the_config_description():
    """A single --batch N is described as before (pypto-e2e fingerprints this dict)."""
    assert "batches" not in BenchConfig(batch=4).to_dict()
    assert BenchConfig(batch=1, batches=(1, 8)).to_dict()["batches"] == [1, 8]
    with pytest.raises(BadInputError, match="not the first of batches 1,8"):
        BenchConfig(batch=4, batches=(1, 8)).validate()


def test_large_batches_are_judged_against_compute():
    kw = {"weight_bytes": 10**9, "kv_per_token": 0.0, "context_tokens": 100, "bandwidth": 1e10}
    small = roofline(batch=1, measured_tok_s=5.0, flops_per_token=1e9, flops_per_s=1e11, **kw)
    assert small["binding"] == "bandwidth"
    assert small["ceiling_tok_s"] == pytest.approx(10.0)
    big = roofline(batch=64, measured_tok_s=50.0, flops_per_token=1e9, flops_per_s=1e11, **kw)
    assert big["binding"] == "compute"
    assert big["bandwidth_ceiling_tok_s"] == pytest.approx(640.0)
    assert big["ceiling_tok_s"] == pytest.approx(100.0)
    assert big["fraction_of_ceiling"] == pytest.approx(0.5)
    assert big["fraction_of_bandwidth_ceiling"] == pytest.approx(50 / 640)
