"""Statistics, token counting and the decode roofline.

Every arm reports the same statistics over the same number of samples (the seed
harness used best-of-N for eager and a hard-coded mean of 20 replays for graph, so its
ratios compared different estimators).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "BANDWIDTH_METHOD",
    "MATMUL_METHOD",
    "RSS_METHOD",
    "STEP_LATENCY_HOW",
    "RssPeak",
    "attention_flops_per_token",
    "cache_bytes_probe",
    "count_tokens",
    "indexer_bytes_per_token",
    "kv_bytes_per_token",
    "match_rate",
    "measure_bandwidth",
    "measure_matmul_peak",
    "read_rss",
    "roofline",
    "step_percentiles",
    "summarize",
    "summarize_seconds",
    "timed",
    "weight_bytes_read_per_step",
]

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


def timed(device: Any, fn: Callable[[], Any]) -> tuple[Any, float]:
    """``(fn(), seconds)``: the one timed span of every arm and of the family runners; it
    starts and ends with a device synchronize, so queued device work is never counted in
    the wrong span."""
    from pypto_capture import synchronize

    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


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
    nothing; sparse-attention layers add their indexer key
    (:func:`indexer_bytes_per_token`). A sliding layer's cap at its window is the cache's business (the graph arm
    records ``kv_cache``), not a per-token figure.
    """
    cfg = _text_config(model)
    elem = next(model.parameters()).element_size()
    return _kv_bytes_per_token(cfg, elem) + indexer_bytes_per_token(cfg, elem)


def indexer_bytes_per_token(cfg: Any, elem: int) -> int:
    """Sparse-attention indexer key bytes one token adds (DeepSeek-V3.2-style DSA): one
    ``index_head_dim`` key on each layer that runs its own indexer
    (:func:`pypto_capture.indexer_layers`, the rule the capture-safe cache holds them by).
    0 for a model without an indexer."""
    from pypto_capture import indexer_layers

    layers = int(cfg.num_hidden_layers)
    types = list(getattr(cfg, "layer_types", None) or [])
    types = (types + ["full_attention"] * layers)[:layers]
    n = sum(indexer_layers(cfg, types))  # none unless index_head_dim is a positive int
    return n * int(cfg.index_head_dim) * elem if n else 0


def _kv_bytes_per_token(cfg: Any, elem: int) -> int:
    layers = int(cfg.num_hidden_layers)
    heads = int(getattr(cfg, "num_attention_heads", 1))
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


def cache_bytes_probe(model: Any, batch: int, device: Any) -> dict[str, int] | None:
    """What one decoded token adds to the K/V cache and what the recurrent state holds,
    read off transformers' own cache after a one-token forward of ``batch`` rows.

    Why a probe rather than a config formula: hybrid decoders (Gated DeltaNet, Mamba2,
    short-conv, parallel attention + SSM) name their shapes differently in every config,
    and only some layers hold keys; the cache transformers builds for the model knows.
    None when the model keeps no recurrent state (the config formula then stands).
    ``state_bytes`` is read and written once per step, whatever the context length.
    """
    import torch

    try:
        from transformers.cache_utils import LinearAttentionCacheLayerMixin
    except ImportError:  # pragma: no cover - every supported transformers has it
        return None
    ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
    cache = getattr(out, "past_key_values", None) or getattr(out, "cache", None)
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    kv = state = attending = 0
    for layer in layers:
        keys = getattr(layer, "keys", None)
        attending += int(isinstance(keys, torch.Tensor) and keys.dim() == 4)
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            for name in ("conv_states", "recurrent_states"):
                value = getattr(layer, name, None)
                for t in value.values() if isinstance(value, dict) else [value]:
                    if isinstance(t, torch.Tensor):
                        state += t.numel() * t.element_size()
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor) and t.dim() == 4:
                kv += t.numel() * t.element_size() // max(t.shape[-2], 1)
    if not state:
        return None
    return {"kv_bytes_per_token": kv // batch, "state_bytes": state, "attention_layers": attending}


def attention_flops_per_token(
    model: Any, context_tokens: float, attention_layers: int | None = None
) -> float:
    """FLOPs one decoded token spends attending over ``context_tokens`` positions:
    QK^T and AV, 2 x 2 x heads x head_dim per position, in every layer that attends
    (``attention_layers``: a hybrid's count, from its cache; default every layer)."""
    cfg = _text_config(model)
    layers = int(cfg.num_hidden_layers) if attention_layers is None else attention_layers
    heads = int(getattr(cfg, "num_attention_heads", 1))
    head_dim = int(getattr(cfg, "head_dim", None) or int(cfg.hidden_size) // heads)
    return 4.0 * layers * heads * head_dim * float(context_tokens)


def roofline(
    *,
    weight_bytes: int,
    kv_per_token: float,
    batch: int,
    context_tokens: float,
    bandwidth: float,
    measured_tok_s: float | None,
    flops_per_token: float | None = None,
    flops_per_s: float | None = None,
    state_bytes: int = 0,
) -> dict[str, Any]:
    """Decode ceilings and which binds.

    Bandwidth: batch x bandwidth / (weights + batch x context x kv bytes), the bytes a
    step reads. Compute (when ``flops_per_token`` and the measured matmul ``flops_per_s``
    are given): flops_per_s / flops_per_token, i.e. a step of ``batch`` tokens costs
    batch x flops_per_token. ``ceiling_tok_s`` is the lower one (``binding`` names it) and
    ``fraction_of_ceiling`` is measured against it: large batches are judged against
    compute, batch 1 against bandwidth. ``state_bytes`` (recurrent layers' conv and SSM /
    delta-rule states of the whole batch) is read and written by every step: it counts twice.
    """
    bytes_per_step = weight_bytes + batch * context_tokens * kv_per_token + 2 * state_bytes
    bw_ceiling = batch * bandwidth / bytes_per_step
    out: dict[str, Any] = {
        "bytes_per_step": int(bytes_per_step),
        "state_bytes_per_step": int(2 * state_bytes),
        "context_tokens": context_tokens,
        "bandwidth_ceiling_tok_s": bw_ceiling,
        "flops_per_step": None,
        "compute_ceiling_tok_s": None,
    }
    ceiling, binding = bw_ceiling, "bandwidth"
    if flops_per_token and flops_per_s:
        compute_ceiling = flops_per_s / flops_per_token
        out["flops_per_step"] = batch * flops_per_token
        out["compute_ceiling_tok_s"] = compute_ceiling
        if compute_ceiling < bw_ceiling:
            ceiling, binding = compute_ceiling, "compute"
    out["ceiling_tok_s"] = ceiling
    out["binding"] = binding
    out["fraction_of_ceiling"] = (measured_tok_s / ceiling) if measured_tok_s else None
    out["fraction_of_bandwidth_ceiling"] = (measured_tok_s / bw_ceiling) if measured_tok_s else None
    cc = out["compute_ceiling_tok_s"]
    out["fraction_of_compute_ceiling"] = (measured_tok_s / cc) if (measured_tok_s and cc) else None
    return out


RSS_METHOD = (
    "Linux: '5' written to /proc/self/clear_refs before the arm resets the resident-set "
    "high-water mark; VmHWM (peak) and VmRSS (now) read from /proc/self/status after it"
)


class RssPeak:
    """The process's resident-memory peak over a span (CPU arms' memory figure).

    CPU tensors come from the system allocator, which keeps no peak counters: torch's
    allocator figures read 0 there, and a 0 looks like a measurement. The kernel tracks the
    resident-set high-water mark (VmHWM) and lets a process reset it (clear_refs "5", Linux
    4.0+), so each arm's peak is its own. Where that is impossible the figures are None and
    ``unavailable`` says why; nothing is guessed.
    """

    def __init__(self) -> None:
        self.unavailable: str | None = self._reset()

    @staticmethod
    def _reset() -> str | None:
        if not sys.platform.startswith("linux"):
            return f"not Linux ({sys.platform}): no resettable resident-memory peak"
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                fh.write("5")
        except OSError as err:
            return f"/proc/self/clear_refs is not writable ({err.strerror or err})"
        return None

    def result(self) -> dict[str, Any]:
        """``rss_peak_bytes``, ``rss_bytes``, ``rss_method`` and ``rss_unavailable``."""
        peak = now = None
        why = self.unavailable
        if why is None:
            try:
                peak, now = read_rss()
            except OSError as err:
                why = f"/proc/self/status is not readable ({err.strerror or err})"
            if why is None and peak is None:
                why = "/proc/self/status has no VmHWM line"
        return {
            "rss_peak_bytes": peak if why is None else None,
            "rss_bytes": now if why is None else None,
            "rss_method": RSS_METHOD if why is None else None,
            "rss_unavailable": why,
        }


def read_rss() -> tuple[int | None, int | None]:
    """(VmHWM, VmRSS) of this process in bytes from /proc/self/status (None: no such line)."""
    values: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                parts = rest.split()
                if parts and parts[0].isascii() and parts[0].isdigit():
                    values[key] = int(parts[0]) * 1024  # the kernel writes kB
    return values.get("VmHWM"), values.get("VmRSS")


#: How the per-token latency percentiles are measured (the report says it beside them).
STEP_LATENCY_HOW = (
    "one untimed teacher-forced pass (the numerical gate's), the device synchronized around "
    "every step; the timed rounds never synchronize inside the loop"
)


def step_percentiles(seconds: list[float]) -> dict[str, Any] | None:
    """Per-token decode latency: p50 / p90 / p99 / mean / max in milliseconds over the steps
    (nearest-rank percentiles), with how they were measured; None without steps."""
    import math

    times = sorted(float(t) for t in seconds if math.isfinite(t) and t >= 0)
    if not times:
        return None

    def rank(q: float) -> float:
        return times[min(len(times) - 1, max(0, math.ceil(q * len(times)) - 1))] * 1e3

    return {
        "p50_ms": rank(0.50),
        "p90_ms": rank(0.90),
        "p99_ms": rank(0.99),
        "mean_ms": sum(times) / len(times) * 1e3,
        "max_ms": times[-1] * 1e3,
        "steps": len(times),
        "how": STEP_LATENCY_HOW,
    }
