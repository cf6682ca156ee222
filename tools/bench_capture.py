#!/usr/bin/env python3
"""Decode tok/s, captured graph vs eager, side by side in one run (pypto-capture).

Both arms run the *same* one-token decode step against the same capture-safe static
cache (DecodeStepRunner backend "eager" vs the device's graph backend: compile on CPU,
cudagraph on CUDA, npugraph on NPU), so the ratio isolates what capture buys. Prefill
and capture are outside the timed region; each repeat times `decode(first, steps)`
between two device synchronisations and counts the tokens actually produced
(batch * steps). Random weights: no download.

    python tools/bench_capture.py                       # CPU: tiny + 0.5B-class, fp32
    python tools/bench_capture.py --device cuda --dtype bfloat16
    python tools/bench_capture.py --models tiny --json  # machine-readable on stdout
    python tools/bench_capture.py --python-wrapper      # CPU: + the compile with
                                                        # inductor's Python wrapper

Exit codes: 0 ok, 1 an arm failed, 2 bad usage, 3 environment missing (device/transformers).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

# 0.5B-class: Qwen2-0.5B's published shape (24 layers, hidden 896, GQA 14/2, vocab 151936).
CONFIGS = {
    "tiny": dict(
        model_type="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=259,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    ),
    "0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
    ),
}


def _build(name: str, dtype, device):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = dict(CONFIGS[name])
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="eager")
    return model.to(device).eval()


def _time_arm(runner, ids, steps, repeats, sync):
    times, tokens = [], None
    for _ in range(repeats):
        runner.reset()
        first = runner.prefill(ids)
        runner.capture()  # no-op after the first repeat; never inside the timed region
        sync()
        t0 = time.perf_counter()
        out = runner.decode(first, steps)
        sync()
        times.append(time.perf_counter() - t0)
        tokens = out
    return times, tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu | cuda[:N] | npu[:N] | auto (default cpu)")
    p.add_argument("--models", default="tiny,0.5b", help=f"comma list of {sorted(CONFIGS)}")
    p.add_argument(
        "--dtype", default=None, help="float32 (CPU default) | bfloat16 (accelerator default)"
    )
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--steps", type=int, default=32, help="decode steps per repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads on CPU")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument(
        "--python-wrapper",
        action="store_true",
        help="CPU: a third arm, the compiled step with inductor's Python wrapper (the graph "
        "arm's default there is the C++ one), timed beside the others",
    )
    args = p.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    bad = [n for n in names if n not in CONFIGS]
    if bad or args.steps < 1 or args.repeats < 1 or args.batch < 1:
        print(
            f"bench_capture: bad --models {bad} or non-positive --steps/--repeats/--batch",
            file=sys.stderr,
        )
        return 2
    try:
        import torch
        import transformers

        from pypto_capture import (
            CompileBackend,
            DecodeStepRunner,
            PyptoCaptureError,
            device_name,
            memory_stats,
            reset_peak_memory,
            resolve_device,
            synchronize,
        )
    except ImportError as err:
        print(
            f"bench_capture: missing dependency ({err}); pip install pypto-capture[hf]",
            file=sys.stderr,
        )
        return 3
    try:
        device = resolve_device(args.device)
    except PyptoCaptureError as err:
        print(f"bench_capture: {err}", file=sys.stderr)
        return 3
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype or ("float32" if device.type == "cpu" else "bfloat16"))
    report = {
        "schema_version": 1,
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "dtype": str(dtype).replace("torch.", ""),
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "steps": args.steps,
        "repeats": args.repeats,
        "results": [],
    }
    failed = False
    for name in names:
        model = _build(name, dtype, device)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(
            3, model.config.vocab_size, (args.batch, args.prompt_len), generator=g
        ).to(device)
        max_len = args.prompt_len + args.steps + 1
        row = {
            "model": name,
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        }
        arms = {}
        plan: list[tuple[str, object]] = [("eager", "eager"), ("graph", "auto")]
        if args.python_wrapper and device.type == "cpu":
            plan.append(("graph_py", CompileBackend(device, cpp_wrapper=False)))
        for arm, backend in plan:
            try:
                reset_peak_memory(device)
                runner = DecodeStepRunner(
                    model, batch_size=args.batch, max_cache_len=max_len, backend=backend
                )
                t0 = time.perf_counter()
                runner.prefill(ids)
                runner.capture()
                setup = time.perf_counter() - t0
                times, toks = _time_arm(
                    runner, ids, args.steps, args.repeats, lambda: synchronize(device)
                )
            except PyptoCaptureError as err:
                row[arm] = {"error": str(err)}
                failed = True
                print(f"bench_capture: {name} {arm} arm failed: {err}", file=sys.stderr)
                continue
            med = statistics.median(times)
            arms[arm] = toks
            row[arm] = {
                "backend": runner.backend_name,
                "wrapper": getattr(runner.backend, "wrapper", None),
                "tok_s": args.batch * args.steps / med,
                "median_s": med,
                "times_s": times,
                "setup_s": setup,
                # includes the weights (already resident); 0 on CPU, where torch keeps no counters
                "peak_allocated_mb": memory_stats(device).peak_allocated / 2**20,
                "peak_reserved_mb": memory_stats(device).peak_reserved / 2**20,
            }
        if "eager" in arms and "graph" in arms:
            row["graph_over_eager"] = row["graph"]["tok_s"] / row["eager"]["tok_s"]
            row["tokens_match"] = bool(torch.equal(arms["eager"].cpu(), arms["graph"].cpu()))
        if "graph" in arms and "graph_py" in arms:
            # The same compiled kernels, called from C++ or from Python: what the wrapper
            # costs per step, and what each compile took (setup_s: prefill + capture).
            row["cpp_over_python_wrapper"] = row["graph"]["tok_s"] / row["graph_py"]["tok_s"]
            row["wrapper_tokens_match"] = bool(
                torch.equal(arms["graph"].cpu(), arms["graph_py"].cpu())
            )
        report["results"].append(row)
        del model
    print(
        f"# {report['device_name']} ({device}), torch {report['torch']}, transformers "
        f"{report['transformers']}, {report['dtype']}, batch {args.batch}, {args.steps} steps, "
        f"median of {args.repeats}, {report['threads']} threads",
        file=sys.stderr,
    )
    print(
        f"{'model':<6} {'params':>8} {'eager tok/s':>12} {'graph tok/s':>12} {'backend':>10} {'ratio':>6} {'same tokens':>11} {'capture s':>9} {'peak MiB e/g':>13}",
        file=sys.stderr,
    )
    for r in report["results"]:
        e, g2 = r.get("eager", {}), r.get("graph", {})
        print(
            f"{r['model']:<6} {r['params_m']:>7}M {e.get('tok_s', float('nan')):>12.1f} "
            f"{g2.get('tok_s', float('nan')):>12.1f} {g2.get('backend', '-'):>10} "
            f"{r.get('graph_over_eager', float('nan')):>6.2f} {r.get('tokens_match', '-')!s:>11} "
            f"{g2.get('setup_s', float('nan')):>9.1f} "
            f"{e.get('peak_allocated_mb', 0):>6.0f}/{g2.get('peak_allocated_mb', 0):<6.0f}",
            file=sys.stderr,
        )
        if "graph_py" in r:
            p2 = r["graph_py"]
            print(
                f"{'':<6} python wrapper {p2.get('tok_s', float('nan')):>10.1f} tok/s, "
                f"capture {p2.get('setup_s', float('nan')):.1f} s; C++ over Python "
                f"{r.get('cpp_over_python_wrapper', float('nan')):.2f}x, same tokens "
                f"{r.get('wrapper_tokens_match', '-')}",
                file=sys.stderr,
            )
    if args.json:
        print(json.dumps(report, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
