"""The numerical gate (issue #42): every non-eager arm's logits against eager's, teacher-
forced; an arm that computes something else is marked on every surface, its ratios are
not comparable, and the run exits INACCURATE unless --allow-inaccurate."""

from __future__ import annotations

import json

import pytest

from pypto_bench import EXIT
from pypto_bench.cli import main
from pypto_bench.html_report import report_to_html
from pypto_bench.report import NOT_COMPARABLE, format_table, report_to_markdown
from pypto_testing.planted import OnePercentMLP


def test_a_correct_graph_arm_passes_teacher_forced(decode_report):
    """fp32, tiny Llama, batch 2: the captured step replayed on eager's own tokens gives
    eager's logits (KL far under the fp32 allowance), and its ratio is quoted."""
    report, _ = decode_report
    graph = report.arm("graph")
    num = graph.numerics
    assert num["verdict"] == "pass", num
    assert num["basis"] == "teacher-forced with the eager tokens"
    m = num["metrics"]
    assert m["steps"] == 2 * 12  # every step of both rows: the prefill's and 11 replays
    assert m["kl_max"] < 1e-9
    assert m["top1_agreement"] == 1.0
    assert m["nonfinite"] == 0
    assert num["allowed_kl_max"] == 1e-9
    assert num["dtype"] == "float32"
    assert graph.ratio_to_eager is not None
    assert report.numerics_failed == []
    # Perplexity on the shipped public-domain passage: the captured step replayed on it
    ppl = num["perplexity"]
    assert ppl["text"].startswith("the Gettysburg Address")
    assert ppl["tokens"] == 2 * 12
    assert ppl["arm"] == pytest.approx(ppl["eager"], rel=1e-5)
    assert ppl["ratio_to_eager"] == pytest.approx(1.0, rel=1e-5)
    # Per-token latency percentiles from the same untimed pass (issue #45): every replayed
    # step of the graph arm, every step of eager's reference generate
    for arm in (graph, report.arm("eager")):
        lat = arm.details["step_latency"]
        assert lat["steps"] == 11, lat
        assert 0 < lat["p50_ms"] <= lat["p90_ms"] <= lat["p99_ms"] <= lat["max_ms"]
    assert "graph: per-token latency p50" in format_table(report)
    assert "graph: numerics pass: KL max" in format_table(report)
    assert "perplexity" in format_table(report)
    assert report.arm("eager").numerics is None  # the reference itself


@pytest.fixture
def broken_plugin():
    import pypto_bench

    plugin = OnePercentMLP()
    pypto_bench.register_plugin(plugin)
    try:
        yield plugin
    finally:
        pypto_bench.unregister_plugin(plugin)


def _run(tiny_llama, tmp_path, regime, *extra):
    out = tmp_path / f"{regime}.json"
    argv = ["run", "--model-path", str(tiny_llama), "--device", "cpu", "--regime", regime,
            "--seq", "8", "--gen", "8", "--warmup", "1", "--iters", "2",
            "--arms", "eager,pypto+graph", "--report-file", str(out), "--no-progress", *extra]  # fmt: skip
    return main(argv), out


def test_a_plugin_one_percent_off_fails_the_gate(broken_plugin, tiny_llama, tmp_path, capsys):
    """Decode: the pypto+graph arm with the broken plug-in runs, its greedy tokens may
    even match, but its teacher-forced logits do not: numerics FAIL, no ratio anywhere,
    exit INACCURATE with the way forward named."""
    code, out = _run(tiny_llama, tmp_path, "decode")
    err = capsys.readouterr().err
    assert code == EXIT.INACCURATE == 110, err[-2000:]
    data = json.loads(out.read_text())
    arm = next(a for a in data["arms"] if a["name"] == "pypto+graph")
    assert arm["ok"]
    assert arm["details"]["plugins"] == ["broken_mlp"]
    num = arm["numerics"]
    assert num["verdict"] == "fail", num
    assert num["metrics"]["kl_max"] > num["allowed_kl_max"]
    # Where it went wrong: eager with the plug-in on, module by module, against plain eager
    suspect = num["suspect"]
    assert suspect["what"] == "the kernel plug-ins"
    assert suspect["plugins"] == ["broken_mlp"]
    assert suspect["first_diverging_module"] == "model.layers.1.mlp#0"
    assert arm["ratio_to_eager"] is None
    assert arm["ratio_vs_eager"] is None
    assert "numerics FAIL: pypto+graph" in err
    assert "pypto-precision check" in err
    table = format_table(data)
    row = next(ln for ln in table.splitlines() if ln.startswith("pypto+graph"))
    assert "NUMERICS FAIL" in row
    assert NOT_COMPARABLE in row
    assert "pypto+graph: numerics FAIL" in report_to_markdown(data)
    assert "first diverging module model.layers.1.mlp#0" in table
    page = report_to_html(data)
    assert "NUMERICS FAIL: pypto+graph" in page
    assert NOT_COMPARABLE in page
    # the per-step KL plot: the failing arm's line, one value per teacher-forced step
    steps = num["metrics"]["kl_steps"]
    assert len(steps) == data["config"]["gen"]
    assert max(steps) == pytest.approx(num["metrics"]["kl_max"], rel=0.5)
    assert 'id="numerics"' in page
    assert (
        "KL of each arm&#x27;s logits per step" in page
        or "KL of each arm's logits per step" in page
    )
    assert page.count("<svg") >= 2  # the KL plot beside the throughput plot
    from pypto_testing import browser

    if browser.skip_reason() is None:  # as a reader sees it: headless Chromium, offline
        (tmp_path / "page.html").write_text(page)
        got = browser.open_page(tmp_path / "page.html")
        assert got.console_errors == [], got.console_errors
        assert got.requests == [], got.requests
        assert 'id="numerics"' in got.dom
        assert "model.layers.1.mlp#0" in got.dom  # the diverging module
    assert any("numerics FAIL" in w for w in data["warnings"])


def test_allow_inaccurate_exits_0_and_still_marks_the_arm(
    broken_plugin, tiny_llama, tmp_path, capsys
):
    """Prefill (every prompt position's logits), with --allow-inaccurate: exit 0, and the
    arm is still marked as failed and allowed on every surface."""
    code, out = _run(tiny_llama, tmp_path, "prefill", "--allow-inaccurate")
    err = capsys.readouterr().err
    assert code == EXIT.OK, err[-2000:]
    data = json.loads(out.read_text())
    assert data["config"]["allow_inaccurate"] is True
    arm = next(a for a in data["arms"] if a["name"] == "pypto+graph")
    assert arm["numerics"]["verdict"] == "fail"
    assert arm["numerics"]["allowed_by_user"]
    assert arm["numerics"]["basis"] == "every prompt position's logits"
    assert arm["ratio_to_eager"] is None
    assert "numerics FAIL allowed by --allow-inaccurate" in err
    assert "allowed by --allow-inaccurate" in report_to_html(data)


def test_the_static_moe_proxy_is_exempt_and_says_so():
    """An arm whose outputs differ by design gets no verdict but the exemption, stated."""
    from pypto_bench.numerics import arm_numerics
    from pypto_bench.report import ArmResult

    arm = ArmResult(name="graph", outputs_differ_by_design="static MoE routing proxy")
    arm_numerics(None, arm, None, None)  # type: ignore[arg-type]
    assert arm.numerics == {"verdict": "exempt", "why": "static MoE routing proxy"}


def test_bf16_is_judged_against_its_own_floor(tiny_llama):
    """bf16: the arm's logits against a float32 copy of the model (teacher-forced on the
    same tokens), within 2 x the error eager itself has in bf16 against that copy."""
    from pypto_bench import BenchConfig, run_bench
    from pypto_bench.numerics import FLOOR_K

    config = BenchConfig(model_path=str(tiny_llama), device="cpu", regime="decode", seq=8,
                         gen=8, arms=("eager", "graph"), warmup=1, iters=2, dtype="bfloat16")  # fmt: skip
    num = run_bench(config).arm("graph").numerics
    assert num["verdict"] == "pass", num
    assert num["dtype"] == "bfloat16"
    assert 0 < num["floor"] < 1e-3
    assert num["allowed_kl_max"] == pytest.approx(max(FLOOR_K * num["floor"], 1e-7))
    assert num["metrics_vs_float32"]["kl_max"] <= num["allowed_kl_max"]
    assert "against float32" in num["why"]
    assert "floor_note" not in num


def test_no_float32_copy_that_cannot_fit_says_so(tiny_llama, monkeypatch):
    """A model whose float32 copy would not fit is judged by the dtype's default
    allowance, and the report says why (the device's free memory read as 1 byte)."""
    from types import SimpleNamespace

    import pypto_capture.device
    from pypto_bench.loading import load_model
    from pypto_bench.numerics import Reference, half_floor

    model = load_model(str(tiny_llama), device="cpu", dtype="bfloat16").model
    monkeypatch.setattr(pypto_capture.device, "free_bytes", lambda device: 1)
    floor, full, note = half_floor(
        SimpleNamespace(model=model, device="cpu"),  # type: ignore[arg-type]
        Reference("decode", "bfloat16", None),
    )
    assert floor is None
    assert full is None
    assert "no float32 copy fits" in note


def test_step_percentiles_are_nearest_rank_and_refuse_nothing():
    from pypto_bench.measure import step_percentiles

    lat = step_percentiles([0.001 * i for i in range(1, 101)])  # 1 .. 100 ms
    assert (lat["p50_ms"], lat["p90_ms"], lat["p99_ms"]) == pytest.approx((50, 90, 99))
    assert lat["max_ms"] == pytest.approx(100)
    assert lat["steps"] == 100
    assert step_percentiles([]) is None
    assert step_percentiles([float("nan"), -1.0]) is None


def test_a_failing_hf_compile_arm_names_the_peer_recipe_not_the_capture():
    """hf-compile is transformers' own static cache + torch.compile (issue #44: GLM-MoE-DSA
    at 81% of tokens): when it fails the gate, the suspect is the peer's recipe, said so,
    and a failing graph arm without plug-ins still names the capture."""
    from pypto_bench.numerics import Gate
    from pypto_bench.report import ArmResult

    peer = ArmResult(name="hf-compile", numerics={"verdict": "fail"})
    graph = ArmResult(name="graph", numerics={"verdict": "fail"})
    passing = ArmResult(name="pypto+graph", numerics={"verdict": "pass"})
    # No reference, no context: locate() reads no model for arms without plug-in dumps.
    Gate(None, None).locate([peer, graph, passing])
    assert peer.numerics["suspect"]["what"] == "transformers' own compile recipe"
    assert "not pypto-capture's graph" in peer.numerics["suspect"]["why"]
    assert graph.numerics["suspect"]["what"] == "the capture"
    assert "suspect" not in passing.numerics
