"""Sparse-attention decoders (a DeepSeek-V3.2-style indexer whose keys the cache keeps:
GLM-MoE-DSA, HY-V4) through the bench's decode arms, built with transformers' own classes.

The graph arm's capture-safe cache holds an ``indexed`` layer (the K/V ring plus the
indexer's keys at the same slots) where the model runs its own indexer, and a plain ring
where a layer reuses another's selection (HY-V4's ``shared`` indexers): tokens equal eager
and its logits pass the numerical gate, teacher-forced; the indexer bytes equal batch x
slots x index_head_dim x element size per indexing layer. Qwen4-exp keeps a growing
history of indexer positions as well, which no fixed-shape step can hold: refused in one
line, before any capture.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
arch = pytest.importorskip("pypto_testing.architectures")

from pypto_bench import BenchConfig, run_bench  # noqa: E402
from pypto_bench.report import report_to_markdown  # noqa: E402

SEQ, GEN = 10, 10


@pytest.mark.parametrize("model_type", arch.SPARSE_ARCHITECTURES)
def test_sparse_attention_decode_eager_and_graph(tmp_path, model_type):
    import torch
    from transformers import AutoConfig

    why = arch.available(model_type)
    if why:
        pytest.skip(why)
    path = arch.make_tiny_architecture(tmp_path / model_type, model_type)
    torch._dynamo.reset()
    report = run_bench(
        BenchConfig(
            model_path=str(path),
            device="cpu",
            regime="decode",
            arms=("eager", "graph"),
            seq=SEQ,
            gen=GEN,
            warmup=0,
            iters=1,
            measure_bandwidth=False,
        )
    )
    graph = report.arm("graph")
    refusal = arch.expected_outcome(model_type, "decode", "graph")
    if refusal is not None:
        assert not graph.ok
        assert refusal in graph.error, graph.error
        assert "\n" not in graph.error
        assert report.arm("eager").ok
        return
    assert graph.ok, graph.error
    assert graph.token_match["rate"] == 1.0, graph.token_match
    assert graph.token_match["compared"] >= 8
    assert (graph.numerics or {}).get("verdict") == "pass", graph.numerics
    cache = graph.details["kv_cache"]
    config = AutoConfig.from_pretrained(path)
    runs_own = [kind == "full" for kind in config.indexer_types]
    kinds = [e["kind"] for e in cache["layers"]]
    assert kinds == ["indexed" if own else "attention" for own in runs_own], kinds
    slots = SEQ + GEN
    assert all(e["slots"] == slots for e in cache["layers"])
    per_layer = 1 * slots * config.index_head_dim * 4  # batch 1, fp32
    assert [e.get("indexer_bytes") for e in cache["layers"] if e["kind"] == "indexed"] == [
        per_layer
    ] * sum(runs_own)
    assert cache["indexer_bytes"] == per_layer * sum(runs_own)
    assert cache["total_bytes"] == cache["kv_bytes"] + cache["indexer_bytes"]
    assert "indexer keys" in report_to_markdown(report)
