"""The hf-compile arm: transformers' static cache + torch.compile, measured like the others."""

from __future__ import annotations

import json

import pytest

from pypto_bench import BadInputError, BenchConfig, run_bench
from pypto_bench.report import format_table, report_to_markdown

PEER = "hf-compile"


def _config(model, regime: str, arms=("eager", "graph", PEER), **kw) -> BenchConfig:
    values = dict(
        model_path=str(model),
        device="cpu",
        regime=regime,
        seq=6,
        gen=6,
        warmup=1,
        iters=2,
        arms=arms,
        measure_bandwidth=False,
    )
    values.update(kw)
    return BenchConfig(**values)


@pytest.fixture(scope="module")
def decode_report(tiny_llama):
    return run_bench(_config(tiny_llama, "decode"))


def test_decode_peer_arm_is_the_compiled_static_cache_recipe(decode_report, tiny_llama):
    peer = decode_report.arm(PEER)
    assert peer is not None
    assert peer.ok, peer.error
    # generate really took its compiled path (else the arm would measure eager again)
    assert peer.details["compiled"] is True
    assert peer.details["peer"]["mode"] == "default"  # CPU: no CUDA graphs to reduce overhead
    assert peer.details["capture_s"] > 0
    # the same protocol as eager: prefill split off, decode tokens = gen - 1 per row
    assert peer.tokens_per_iter == [5, 5]
    assert peer.ttft_s["median"] > 0
    assert peer.seconds["median"] > 0
    assert peer.token_match["rate"] == 1.0


def test_every_arm_is_compared_with_the_peer(decode_report):
    graph, peer, eager = (decode_report.arm(n) for n in ("graph", PEER, "eager"))
    assert peer.ratio_to_peer == pytest.approx(1.0)
    assert graph.ratio_to_peer == pytest.approx(
        graph.tokens_per_s["best"] / peer.tokens_per_s["best"]
    )
    assert eager.ratio_to_peer is not None
    data = json.loads(decode_report.to_json())
    assert {a["name"]: a["ratio_to_peer"] for a in data["arms"]}[PEER] == pytest.approx(1.0)
    assert "x hf-compile" in report_to_markdown(decode_report)
    assert "x hf-compile" in format_table(decode_report)


def test_peer_leaves_the_model_as_loaded(tiny_llama):
    """A later arm must not inherit generate's compiled call (nor its memory)."""
    from pypto_bench import open_session

    session = open_session(_config(tiny_llama, "decode", arms=(PEER,), gen=3))
    with session.iteration(PEER) as run:
        run()
        assert getattr(session.model, "_compiled_call", None) is not None
    assert "_compiled_call" not in vars(session.model)


def test_prefill_peer_arm(tiny_llama):
    report = run_bench(_config(tiny_llama, "prefill", arms=("eager", PEER)))
    peer = report.arm(PEER)
    assert peer.ok, peer.error
    assert peer.token_match["rate"] == 1.0
    assert peer.tokens_per_iter == [6, 6]
    assert report.arm("eager").ratio_to_peer is not None


def test_peer_arm_refused_where_transformers_has_no_recipe(tiny_llama, tmp_path):
    out = tmp_path / "r.json"
    cfg = _config(tiny_llama, "diffusion-generate", arms=("eager", PEER), report_file=str(out))
    with pytest.raises(BadInputError, match="hf-compile arm runs in the decode and prefill"):
        run_bench(cfg)
    assert not out.exists()
