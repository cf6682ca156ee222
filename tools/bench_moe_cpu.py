#!/usr/bin/env python3
"""MoE decode tok/s: exact captured MoE vs eager vs the static proxy, side by side.

A MiniMax-M2-shaped model with random weights (native ``MiniMaxM2ForCausalLM``: full GQA
attention with head_dim 128, qk-norm over the whole projection, partial RoPE, sigmoid
router with score-correction bias, top-8 routing over many small experts), scaled to
about 0.5B parameters in total (the vocabulary is cut to 32k, so the output head does
not dominate the step). Decode, batch 1, greedy, one run, every arm on the same prompt:

* ``eager``: transformers' ``generate`` (its default experts implementation), timed
  from the first logits to the last token, like pypto-bench's eager arm;
* ``exact``: ``apply_exact_moe`` + pypto-capture's ``DecodeStepRunner`` with the device's
  graph backend (compile on CPU, cudagraph on CUDA); tokens checked against ``eager``;
* ``static``: ``apply_static_moe`` (every token to fixed experts: the seed's proxy) through
  the same runner; its tokens differ from eager's by design and are not compared;
* ``native-graph`` (``--native-graph``): transformers' own experts forward captured as is
  (on CPU its grouped_mm fallback compiles; on an NPU it does not), for reference.

Bandwidth ceiling: weights read per step = every non-expert weight once (the input
embedding excepted: a step reads one row) + the k selected experts of each MoE layer
(not all experts) + the static cache's keys/values; ceiling tok/s = bandwidth / bytes,
bandwidth measured in this run (pypto-bench's tensor copy / read). Capture and compile
times are outside every timed region.

    python tools/bench_moe_cpu.py                          # CPU, fp32 (a few minutes)
    python tools/bench_moe_cpu.py --device cuda --dtype bfloat16
    python tools/bench_moe_cpu.py --preset tiny --json     # seconds; machine-readable

Exit codes: 0 ok, 1 an arm failed or exact tokens differ from eager, 2 bad usage,
3 environment missing (device, transformers).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any

# MiniMax-M2: 62 layers, hidden 3072, 48/8 heads x 128, rotary 64, 256 experts top-8,
# expert intermediate 1536 (= hidden / 2), vocab 200064. Scaled down keeping head_dim,
# rotary_dim, top-8 and intermediate = hidden / 2; 128 experts instead of 256.
PRESETS: dict[str, dict[str, Any]] = {
    "0.5b": dict(
        hidden_size=512,
        intermediate_size=256,
        num_hidden_layers=9,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        rotary_dim=64,
        num_local_experts=128,
        num_experts_per_tok=8,
        vocab_size=32000,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rotary_dim=8,
        num_local_experts=16,
        num_experts_per_tok=4,
        vocab_size=259,
    ),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="0.5b")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, npu:0 ...")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--seq", type=int, default=32, help="prompt tokens")
    p.add_argument("--gen", type=int, default=32, help="tokens decoded per repeat")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per arm (best kept)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument(
        "--native-graph",
        action="store_true",
        help="also capture transformers' own experts forward",
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    return p


def _build(preset: str, dtype: Any, device: Any) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "minimax_m2",
        **PRESETS[preset],
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="eager")
    with torch.no_grad():  # wider than the init so greedy decoding does not repeat one token
        for name, p in model.named_parameters():
            if (p.dim() == 2 and "norm" not in name) or p.dim() == 3:
                p.normal_(0.0, 0.05)
    return model.to(device).eval()


def _bytes_per_step(model: Any, batch: int, cache_len: int) -> dict[str, int]:
    from pypto_bench.measure import kv_bytes_per_token, weight_bytes_read_per_step
    from pypto_capture import moe_weight_bytes

    weights = weight_bytes_read_per_step(model)  # every weight once, all experts included
    moe = moe_weight_bytes(model, batch) or {"expert_bytes": 0, "active_expert_bytes": 0}
    active_weights = weights - moe["expert_bytes"] + moe["active_expert_bytes"]
    kv = kv_bytes_per_token(model) * batch * cache_len
    return {
        "all_weight_bytes": weights,
        "expert_bytes": moe["expert_bytes"],
        "active_expert_bytes": moe["active_expert_bytes"],
        "weights_read_per_step": active_weights,
        "kv_bytes_per_step": kv,
        "bytes_per_step": active_weights + kv,
    }


def _eager(model: Any, ids: Any, gen: int, repeats: int, sync: Any) -> tuple[list[float], Any]:
    import torch
    from transformers import LogitsProcessorList

    class Stamp:
        def __init__(self) -> None:
            self.t: float | None = None

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            if self.t is None:
                sync()
                self.t = time.perf_counter()
            return scores

    times, tokens = [], None
    for _ in range(repeats + 1):  # the first call warms up
        stamp = Stamp()
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=gen,
                min_new_tokens=gen,
                pad_token_id=0,
                logits_processor=LogitsProcessorList([stamp]),
            )
        sync()
        assert stamp.t is not None
        times.append(time.perf_counter() - stamp.t)
        tokens = out[:, ids.shape[1] :]
    return times[1:], tokens


def _graph(
    model: Any, ids: Any, gen: int, repeats: int, device: Any, sync: Any
) -> tuple[list[float], Any, float]:
    import torch

    from pypto_capture import DecodeStepRunner

    runner = DecodeStepRunner(
        model, batch_size=ids.shape[0], max_cache_len=ids.shape[1] + gen, device=device
    )
    times, tokens = [], None
    with torch.inference_mode():
        runner.reset()
        runner.prefill(ids)
        t0 = time.perf_counter()
        runner.capture()
        capture_s = time.perf_counter() - t0
        for _ in range(repeats + 1):
            runner.reset()
            first = runner.prefill(ids)
            sync()
            t = time.perf_counter()
            rest = runner.decode(first, gen - 1)
            sync()
            times.append(time.perf_counter() - t)
            tokens = torch.cat([first.reshape(-1, 1), rest], dim=1)
    runner.close()
    return times[1:], tokens, capture_s


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    if args.seq < 1 or args.gen < 2 or args.repeats < 1:
        print("bench_moe_cpu: error: --seq >= 1, --gen >= 2, --repeats >= 1", file=sys.stderr)
        return 2
    try:
        import torch
        import transformers

        from pypto_bench.measure import measure_bandwidth
        from pypto_capture import (
            apply_exact_moe,
            apply_static_moe,
            device_name,
            resolve_device,
            synchronize,
        )
    except ImportError as err:
        print(f"bench_moe_cpu: error: {err}: install pypto-bench and transformers", file=sys.stderr)
        return 3
    try:
        device = resolve_device(args.device)
    except Exception as err:
        print(f"bench_moe_cpu: error: device {args.device!r}: {err}", file=sys.stderr)
        return 3
    if args.threads:
        torch.set_num_threads(args.threads)

    def sync() -> None:
        synchronize(device)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    model = _build(args.preset, dtype, device)
    params = sum(p.numel() for p in model.parameters())
    log(
        f"built {args.preset} MiniMax-M2-shaped model: {params / 1e6:.0f}M parameters ({time.perf_counter() - t0:.1f}s)"
    )
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, int(model.config.vocab_size), (1, args.seq), generator=g).to(device)
    sizes = _bytes_per_step(model, 1, args.seq + args.gen)
    bandwidth = measure_bandwidth(device)["bytes_per_s"]
    ceiling = bandwidth / sizes["bytes_per_step"]
    decoded = args.gen - 1  # the graph arms time decode(first, gen - 1); eager the same span

    arms: dict[str, dict[str, Any]] = {}
    failed = False

    def record(name: str, times: list[float], extra: dict[str, Any]) -> None:
        best = min(times)
        tok_s = decoded / best
        arms[name] = {
            "tok_s_best": tok_s,
            "tok_s_median": decoded / statistics.median(times),
            "seconds": times,
            "fraction_of_ceiling": tok_s / ceiling,
            **extra,
        }
        log(f"{name:>12}: {tok_s:8.2f} tok/s ({tok_s / ceiling:.0%} of the ceiling)")

    log("eager generate ...")
    times, ref = _eager(model, ids, args.gen, args.repeats, sync)
    record("eager", times, {})
    for name, install in (
        ("exact", apply_exact_moe),
        ("static", lambda m: apply_static_moe(m, token_counts=(1,))),
        *((("native-graph", None),) if args.native_graph else ()),
    ):
        log(f"{name} graph ...")
        handle = install(model) if install is not None else None
        try:
            times, tokens, capture_s = _graph(model, ids, args.gen, args.repeats, device, sync)
        except Exception as err:  # one failing arm must not hide the others' figures
            failed = True
            arms[name] = {"error": f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"}
            log(f"{name:>12}: FAILED {arms[name]['error']}")
            continue
        finally:
            if handle is not None:
                handle.undo()
        extra: dict[str, Any] = {"capture_s": capture_s}
        if name != "static":
            extra["tokens_match_eager"] = bool(torch.equal(tokens.cpu(), ref.cpu()))
            if name == "exact" and not extra["tokens_match_eager"]:
                failed = True
        record(name, times, extra)

    base = arms["eager"]["tok_s_best"]
    for arm in arms.values():
        if "tok_s_best" in arm:
            arm["x_eager"] = arm["tok_s_best"] / base
    if "tok_s_best" in arms.get("exact", {}) and "tok_s_best" in arms.get("static", {}):
        arms["exact"]["x_static"] = arms["exact"]["tok_s_best"] / arms["static"]["tok_s_best"]
    result = {
        "preset": args.preset,
        "config": PRESETS[args.preset],
        "parameters": params,
        "device": device_name(device),
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "seq": args.seq,
        "gen": args.gen,
        "repeats": args.repeats,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "host": platform.processor() or platform.machine(),
        "bandwidth_bytes_per_s": bandwidth,
        **sizes,
        "ceiling_tok_s": ceiling,
        "arms": arms,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        log(
            f"bytes per step {sizes['bytes_per_step'] / 2**20:.0f} MiB (experts read: "
            f"{sizes['active_expert_bytes'] / 2**20:.0f} of {sizes['expert_bytes'] / 2**20:.0f} MiB), "
            f"bandwidth {bandwidth / 1e9:.1f} GB/s, ceiling {ceiling:.1f} tok/s"
        )
        for name, arm in arms.items():
            if "tok_s_best" in arm:
                extra = f"  x static {arm['x_static']:.2f}" if "x_static" in arm else ""
                log(f"{name:>12}  x eager {arm['x_eager']:.2f}{extra}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
