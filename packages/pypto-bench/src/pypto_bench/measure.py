"""Statistics, token counting and the decode roofline.

Every arm reports the same statistics over the same number of samples (the seed
harness used best-of-N for eager and a hard-coded mean of 20 replays for graph, so its
ratios compared different estimators).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

BANDWIDTH_METHOD = (
    "best of {n} over {mib} MiB float32: max(copy dst.copy_(src) counting read + write "
    "= {copy_gbs:.1f} GB/s, read-only reduction src.sum() = {read_gbs:.1f} GB/s)"
)


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """samples + best (max; the seed's headline), median, mean, stdev (sample, 0 if n < 2)."""
    values = [float(v) for v in samples]
    if not values:
        return {"samples": [], "best": None, "median": None, "mean": None, "stdev": None}
    return {
        "samples": values,
        "best": max(values),
        "median": statistics.median(values),
        "mean": statistics.fmean(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def summarize_seconds(samples: Sequence[float]) -> dict[str, Any]:
    """Like ``summarize`` but best = min (fastest) for durations."""
    out = summarize(samples)
    if samples:
        out["best"] = min(float(v) for v in samples)
    return out


def count_tokens(generated: Any, eos_ids: Sequence[int], *, ignore_eos: bool = False) -> list[int]:
    """Tokens actually produced per row: up to and including the first EOS.

    Anything after a row's EOS is padding (HF generate) or post-EOS continuation (a
    fixed-length captured decode): neither is output, so neither is counted.
    """
    rows = generated.tolist() if hasattr(generated, "tolist") else [list(r) for r in generated]
    counts = []
    eos = set(int(e) for e in eos_ids)
    for row in rows:
        n = len(row)
        if not ignore_eos:
            for i, tok in enumerate(row):
                if tok in eos:
                    n = i + 1
                    break
        counts.append(n)
    return counts


def match_rate(
    reference: Any, candidate: Any, ref_counts: Sequence[int], cand_counts: Sequence[int]
) -> dict[str, Any]:
    """Greedy agreement over the positions both produced (per row, up to the shorter)."""
    ref = reference.tolist() if hasattr(reference, "tolist") else reference
    cand = candidate.tolist() if hasattr(candidate, "tolist") else candidate
    compared = matched = 0
    first_mismatch: list[int] | None = None
    for r, (a, b) in enumerate(zip(ref, cand, strict=True)):
        n = min(ref_counts[r], cand_counts[r], len(a), len(b))
        for i in range(n):
            compared += 1
            if a[i] == b[i]:
                matched += 1
            elif first_mismatch is None:
                first_mismatch = [r, i]
    return {
        "rate": (matched / compared) if compared else None,
        "compared": compared,
        "matched": matched,
        "first_mismatch": first_mismatch,
    }


def measure_bandwidth(device: Any, *, mib: int = 256, repeats: int = 5) -> dict[str, Any]:
    """Practical memory bandwidth of ``device`` (bytes/s), measured in this run."""
    import torch

    from pypto_capture import synchronize

    n = mib * 1024 * 1024 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)

    def best_seconds(fn: Any) -> float:
        fn()
        best = float("inf")
        for _ in range(repeats):
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            best = min(best, time.perf_counter() - start)
        return best

    # A decode step mostly *reads* weights, so a read-only stream is the fairer ceiling;
    # the copy is kept because on some devices it streams faster than a reduction.
    copy_bps = 2 * n * 4 / best_seconds(lambda: dst.copy_(src))
    read_bps = n * 4 / best_seconds(lambda: src.sum())
    return {
        "bytes_per_s": max(copy_bps, read_bps),
        "method": BANDWIDTH_METHOD.format(
            mib=mib, n=repeats, copy_gbs=copy_bps / 1e9, read_gbs=read_bps / 1e9
        ),
    }


MATMUL_METHOD = (
    "best of {n} square {size}x{size} {dtype} matmuls (2*n^3 FLOPs each) = {tflops:.3f} TFLOP/s"
)


def measure_matmul_peak(
    device: Any, dtype: Any = None, *, size: int | None = None, repeats: int = 5
) -> dict[str, Any]:
    """Practical matmul throughput (FLOP/s) of ``device`` for ``dtype``, measured in this run.

    The compute ceiling a large batch or prefill is judged against (bandwidth binds decode).
    A square matmul large enough to leave the launch overhead behind: 2048 on accelerators,
    1024 on CPU (a 2-core host would spend seconds on 2048^3).
    """
    import torch

    from pypto_capture import synchronize

    dtype = dtype or torch.float32
    dev = torch.device(device)
    n = size or (1024 if dev.type == "cpu" else 4096)
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        synchronize(dev)
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize(dev)
        best = min(best, time.perf_counter() - start)
    flops = 2.0 * n**3 / best
    name = str(dtype).replace("torch.", "")
    return {
        "flops_per_s": flops,
        "dtype": name,
        "method": MATMUL_METHOD.format(n=repeats, size=n, dtype=name, tflops=flops / 1e12),
    }


def _text_config(model: Any) -> Any:
    config = model.config
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def kv_bytes_per_token(model: Any) -> int:
    """K and V bytes one token adds to the cache, summed over the layers that hold one.

    Uniform models: 2 x layers x kv_heads x head_dim x element size. Models whose head
    shapes differ per layer type are summed per layer: transformers' heterogeneous
    configs (``per_layer_config[i]``, Gemma 4 at 5.24, where the global attribute raises)
    or the older ``global_head_dim`` / ``num_global_key_value_heads`` for full layers.
    Layers that reuse another layer's keys and values (``num_kv_shared_layers``) add
    nothing. A sliding layer's cap at its window is the cache's business (the graph arm
    records ``kv_cache``), not a per-token figure.
    """
    cfg = _text_config(model)
    layers = int(cfg.num_hidden_layers)
    heads = int(getattr(cfg, "num_attention_heads", 1))
    elem = next(model.parameters()).element_size()
    shared = int(getattr(cfg, "num_kv_shared_layers", 0) or 0)
    holding = range(layers - shared)

    def shape(source: Any) -> tuple[int, int]:
        kv = getattr(source, "num_key_value_heads", None) or heads
        dim = getattr(source, "head_dim", None) or int(cfg.hidden_size) // heads
        return int(kv), int(dim)

    per_layer = getattr(cfg, "per_layer_config", None)
    try:
        views = [per_layer[i] for i in range(layers)] if per_layer is not None else None
    except (IndexError, KeyError, TypeError):
        views = None
    if views is not None:
        return elem * sum(2 * kv * dim for kv, dim in (shape(views[i]) for i in holding))
    kv_heads, head_dim = shape(cfg)
    types = list(getattr(cfg, "layer_types", None) or [])
    global_dim = getattr(cfg, "global_head_dim", None)
    if global_dim and len(types) == layers:
        global_kv = int(getattr(cfg, "num_global_key_value_heads", None) or kv_heads)
        return elem * sum(
            2 * global_kv * int(global_dim)
            if types[i] == "full_attention"
            else 2 * kv_heads * head_dim
            for i in holding
        )
    return 2 * len(holding) * kv_heads * head_dim * elem


def weight_bytes_read_per_step(model: Any) -> int:
    """Bytes of weights a decode step reads: every parameter once, except an untied
    input embedding (a step gathers only B rows of it)."""
    seen: set[int] = set()
    total = 0
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    emb_ptr = emb.weight.data_ptr() if emb is not None else None
    tied = out is not None and emb is not None and out.weight.data_ptr() == emb_ptr
    for p in model.parameters():
        ptr = p.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        if ptr == emb_ptr and not tied:
            continue
        total += p.numel() * p.element_size()
    return total


def roofline(
    *,
    weight_bytes: int,
    kv_per_token: float,
    batch: int,
    context_tokens: float,
    bandwidth: float,
    measured_tok_s: float | None,
) -> dict[str, Any]:
    """Decode ceiling: batch x bandwidth / (weights + batch x context x kv bytes)."""
    bytes_per_step = weight_bytes + batch * context_tokens * kv_per_token
    ceiling = batch * bandwidth / bytes_per_step
    return {
        "bytes_per_step": int(bytes_per_step),
        "context_tokens": context_tokens,
        "ceiling_tok_s": ceiling,
        "fraction_of_ceiling": (measured_tok_s / ceiling) if measured_tok_s else None,
    }
