#!/usr/bin/env python3
"""Gemma 4 decode: captured graph vs eager, side by side in one run (pypto-models-gemma4).

Two Gemma-4-shaped models with random weights (no download), both with the published
31B's structure scaled down: 5 sliding : 1 full layers, full layers with their own head
shape and K = V, both RoPE variants, softcapped logits:

* ``tiny``: the test suite's size (hidden 64, 6 layers; window 16);
* ``0.5b``: hidden 1024, 12 layers, 8 q heads; sliding layers 4 KV heads x 128, full
  layers 2 KV heads x 256; Gemma's 262144-token vocabulary (tied), window 32;
  about 0.5B parameters.

Arms, per model, with the same prompt and the same number of new tokens:

* ``eager``: the native model's forward with transformers' ``DynamicCache``, one token at
  a time (what ``generate`` runs per step);
* ``eager-static``: pypto-capture's ``DecodeStepRunner`` step uncaptured (backend
  "eager"): the capture-safe ring-buffer cache without the graph;
* ``graph``: the same step captured (backend "auto": compile on CPU, cudagraph on CUDA).

Each decode is timed per chunk of steps between device synchronisations, so the report
also gives the cost per token before the sliding window fills and after it (the ring
keeps the graph's cost flat; transformers' dynamic cache grows until the window is full).
The bandwidth ceiling is ``batch x bandwidth / (weight bytes + KV bytes a step reads)``
with the bandwidth measured in this run (pypto-bench's probe); the share is the arm's
best tok/s over that ceiling.

    python tools/bench_gemma4_cpu.py                     # CPU, fp32, tiny + 0.5b
    python tools/bench_gemma4_cpu.py --models tiny --json
    python tools/bench_gemma4_cpu.py --device cuda --dtype bfloat16   # a GPU machine

Exit codes: 0 ok, 1 an arm failed, 2 bad usage, 3 environment missing.
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import statistics
import sys
import time
from typing import Any

S, F = "sliding_attention", "full_attention"
ROPE = {
    F: {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
    S: {"rope_theta": 10000.0, "rope_type": "default"},
}
COMMON = {
    "model_type": "gemma4_text",
    "attention_k_eq_v": True,
    "final_logit_softcapping": 30.0,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "rope_parameters": ROPE,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": 1,
}
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "text": {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_global_key_value_heads": 1,
            "global_head_dim": 32,
            "layer_types": [S] * 5 + [F],
            "sliding_window": 16,
            "vocab_size": 259,
            "max_position_embeddings": 512,
        },
        "prompt": 4,
        "new": 64,
        "chunk": 4,
    },
    "0.5b": {
        "text": {
            "hidden_size": 1024,
            "intermediate_size": 5120,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "num_global_key_value_heads": 2,
            "global_head_dim": 256,
            "layer_types": ([S] * 5 + [F]) * 2,
            "sliding_window": 32,
            "vocab_size": 262144,
            "max_position_embeddings": 4096,
        },
        "prompt": 8,
        "new": 64,
        "chunk": 8,
    },
}


def _config(size: str) -> dict[str, Any]:
    text = {**COMMON, **SIZES[size]["text"]}
    text["num_hidden_layers"] = len(text["layer_types"])
    text["vocab_size_per_layer_input"] = text["vocab_size"]
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        "tie_word_embeddings": True,
    }


def _build(size: str, dtype: Any, device: Any) -> Any:
    import torch
    from transformers import Gemma4Config

    from pypto_models_gemma4.modeling import PyptoGemma4ForConditionalGeneration

    torch.manual_seed(0)
    model = PyptoGemma4ForConditionalGeneration(Gemma4Config(**_config(size)))
    with torch.no_grad():  # wider than the default init: a tied Gemma otherwise repeats its input
        for name, p in model.named_parameters():
            if "embed" in name:
                p.normal_(0.0, 0.02)
            elif p.dim() >= 2:
                p.normal_(0.0, 0.25 if size == "tiny" else 0.03)
    model.set_attn_implementation("eager")
    return model.to(device=device, dtype=dtype).eval()


def _chunks(total: int, chunk: int) -> list[int]:
    out = [chunk] * (total // chunk)
    if total % chunk:
        out.append(total % chunk)
    return out


def _eager(model, ids, new, chunk, sync):
    """Native forward + DynamicCache, one token per call; per-chunk seconds."""
    import torch

    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        cache = getattr(out, "cache", None) or out.past_key_values
        params = inspect.signature(type(model).forward).parameters
        kw = "cache" if "cache" in params else "past_key_values"  # 5.24 renamed it
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        pos = ids.shape[1]
        toks, times = [tok], []
        for n in _chunks(new - 1, chunk):
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                position_ids = torch.full_like(tok, pos)
                out = model(
                    input_ids=tok,
                    position_ids=position_ids,
                    use_cache=True,
                    logits_to_keep=1,
                    **{kw: cache},
                )
                cache = getattr(out, "cache", None) or out.past_key_values
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
                toks.append(tok)
                pos += 1
            sync()
            times.append((n, time.perf_counter() - t0))
    return torch.cat(toks, dim=1), times


def _runner_decode(runner, ids, new, chunk, sync):
    import torch

    runner.reset()
    first = runner.prefill(ids)
    runner.capture()  # outside the timed region (no-op once captured)
    toks, times, last = [first[:, None]], [], first
    for n in _chunks(new - 1, chunk):
        sync()
        t0 = time.perf_counter()
        out = runner.decode(last, n)
        sync()
        times.append((n, time.perf_counter() - t0))
        toks.append(out)
        last = out[:, -1]
    return torch.cat(toks, dim=1), times


def _split(runs, prompt, window, batch):
    """tok/s, and ms/token before the window fills vs after it (whole chunks).

    ``runs``: per repeat, the (steps, seconds) of each chunk. Each chunk position takes
    its fastest repeat (noise on a shared machine only ever adds time); tok/s is over the
    sum of those.
    """
    chunks = [(runs[0][i][0], min(run[i][1] for run in runs)) for i in range(len(runs[0]))]
    pos = prompt  # absolute slot of the first decode step's token
    before, after, total_n, total_s = [], [], 0, 0.0
    for n, s in chunks:
        if pos + n <= window:
            before.append(s / n)
        elif pos >= window:
            after.append(s / n)
        pos += n
        total_n += n
        total_s += s
    b = statistics.mean(before) * 1e3 if before else None
    a = statistics.mean(after) * 1e3 if after else None
    return {
        "tok_s": batch * total_n / total_s,
        "ms_per_step_before_window_fills": b,
        "ms_per_step_after_window_fills": a,
        "after_over_before": (a / b) if a and b else None,
    }


def bench(size: str, *, device: Any, dtype: Any, batch: int, repeats: int, backend: str):
    import torch

    from pypto_bench.measure import weight_bytes_read_per_step
    from pypto_capture import DecodeStepRunner, synchronize

    spec = SIZES[size]
    window = spec["text"]["sliding_window"]
    prompt, new, chunk = spec["prompt"], spec["new"], spec["chunk"]
    model = _build(size, dtype, device)
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, min(250, spec["text"]["vocab_size"]), (batch, prompt), generator=g)
    ids = ids.to(device)

    def sync() -> None:
        synchronize(device)

    result: dict[str, Any] = {
        "size": size,
        "parameters": params,
        "layer_types": "5 sliding : 1 full",
        "sliding_window": window,
        "prompt": prompt,
        "new_tokens": new,
        "batch": batch,
        "arms": {},
    }
    max_len = prompt + new + 1
    runners = {
        "eager-static": DecodeStepRunner(
            model, batch_size=batch, max_cache_len=max_len, backend="eager"
        ),
        "graph": DecodeStepRunner(model, batch_size=batch, max_cache_len=max_len, backend=backend),
    }
    t0 = time.perf_counter()
    _runner_decode(runners["graph"], ids, 2, 1, sync)  # capture / compile once, untimed
    result["graph_capture_s"] = time.perf_counter() - t0
    result["graph_backend"] = runners["graph"].backend_name
    tokens: dict[str, Any] = {}
    samples: dict[str, list[Any]] = {k: [] for k in ("eager", "eager-static", "graph")}
    _eager(model, ids, new, chunk, sync)  # warm-up, untimed (first calls allocate)
    _runner_decode(runners["eager-static"], ids, new, chunk, sync)
    for _ in range(repeats):  # arms interleaved: drift on a shared machine hits all alike
        toks, times = _eager(model, ids, new, chunk, sync)
        tokens["eager"] = toks
        samples["eager"].append(times)
        for name, runner in runners.items():
            toks, times = _runner_decode(runner, ids, new, chunk, sync)
            tokens[name] = toks
            samples[name].append(times)
    kv_graph = runners["graph"].cache.nbytes()
    result["kv_cache"] = runners["graph"].cache.describe()
    result["kv_cache"].pop("layers", None)
    weights = weight_bytes_read_per_step(model)
    result["weight_bytes_per_step"] = weights
    from pypto_bench.measure import measure_bandwidth

    bw = measure_bandwidth(device)
    result["bandwidth_bytes_per_s"] = bw["bytes_per_s"]
    ceiling = batch * bw["bytes_per_s"] / (weights + kv_graph)
    result["ceiling_tok_s"] = ceiling
    for name, runs in samples.items():
        arm = _split(runs, prompt, window, batch)
        arm["tok_s_per_repeat"] = [
            batch * sum(n for n, _ in r) / sum(s for _, s in r) for r in runs
        ]
        arm["share_of_ceiling"] = arm["tok_s"] / ceiling
        arm["tokens_equal_eager"] = bool(torch.equal(tokens[name].cpu(), tokens["eager"].cpu()))
        result["arms"][name] = arm
    eager = result["arms"]["eager"]["tok_s"]
    for arm in result["arms"].values():
        arm["x_eager"] = arm["tok_s"] / eager
    for runner in runners.values():
        runner.close()
    return result


def _fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _print_table(results: list[dict[str, Any]], out: Any) -> None:
    print(
        "| model | params | arm | tok/s | x eager | share of ceiling | ms/step before fill"
        " | ms/step after fill | after/before | tokens = eager |",
        file=out,
    )
    print("|---|---|---|---|---|---|---|---|---|---|", file=out)
    for r in results:
        for name, a in r["arms"].items():
            ratio = a["after_over_before"]
            print(
                f"| {r['size']} | {r['parameters'] / 1e6:.1f}M | {name} | {a['tok_s']:.1f} | "
                f"{a['x_eager']:.2f} | {a['share_of_ceiling']:.1%} | "
                f"{_fmt_ms(a['ms_per_step_before_window_fills'])} | "
                f"{_fmt_ms(a['ms_per_step_after_window_fills'])} | "
                f"{'-' if ratio is None else f'{ratio:.2f}'} | {a['tokens_equal_eager']} |",
                file=out,
            )
    for r in results:
        print(
            f"{r['size']}: window {r['sliding_window']}, prompt {r['prompt']}, {r['new_tokens']} new "
            f"tokens, batch {r['batch']}; KV cache {r['kv_cache']['pattern']} = "
            f"{r['kv_cache']['total_bytes'] / 2**20:.2f} MiB "
            f"(slots per type {r['kv_cache']['slots_per_type']}); weights read per step "
            f"{r['weight_bytes_per_step'] / 2**20:.1f} MiB; bandwidth "
            f"{r['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s -> ceiling {r['ceiling_tok_s']:.1f} tok/s; "
            f"graph backend {r['graph_backend']}, capture {r['graph_capture_s']:.1f} s",
            file=out,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,0.5b", help="comma list of: " + ", ".join(SIZES))
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backend", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", action="store_true", help="stdout: one JSON document")
    args = p.parse_args(argv)
    sizes = [s.strip() for s in args.models.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown or args.batch < 1 or args.repeats < 1:
        print(
            f"bench_gemma4_cpu: bad usage: models {unknown or sizes}, batch {args.batch}, "
            f"repeats {args.repeats}; models are {', '.join(SIZES)}",
            file=sys.stderr,
        )
        return 2
    try:
        import torch

        import pypto_models_gemma4  # noqa: F401
        from pypto_capture import resolve_device
    except ImportError as err:
        print(f"bench_gemma4_cpu: missing dependency: {err}", file=sys.stderr)
        return 3
    try:
        device = resolve_device(args.device)
    except Exception as err:
        print(f"bench_gemma4_cpu: device {args.device!r}: {err}", file=sys.stderr)
        return 3
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for size in sizes:
        print(f"[{size}] building and benchmarking ...", file=sys.stderr, flush=True)
        try:
            results.append(
                bench(
                    size,
                    device=device,
                    dtype=getattr(torch, args.dtype),
                    batch=args.batch,
                    repeats=args.repeats,
                    backend=args.backend,
                )
            )
        except Exception as err:
            print(f"bench_gemma4_cpu: {size} failed: {type(err).__name__}: {err}", file=sys.stderr)
            return 1
    doc = {
        "command": " ".join(["python", "tools/bench_gemma4_cpu.py", *(argv or sys.argv[1:])]),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "dtype": args.dtype,
        "machine": platform.processor() or platform.machine(),
        "results": results,
    }
    if args.json:
        print(json.dumps(doc, indent=2))
        _print_table(results, sys.stderr)
    else:
        _print_table(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
