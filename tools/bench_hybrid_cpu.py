"""CPU decode of ~0.5B-class recurrent hybrids: eager vs graph vs hf-compile, side by side.

Three random-weight models built with transformers' own classes (pypto_testing.architectures,
widened): a Qwen3.5-shaped Gated DeltaNet + full-attention hybrid, a Mamba2-shaped SSM and a
Kimi-Linear-shaped KDA + MLA + MoE hybrid. Each is benched by pypto-bench with default flags
(fp32, batch 1, decode), all arms in one run, so the ratios share the machine's state; the
table gives median tok/s with the spread (min-max over iterations), the ratios, and the share
of the bandwidth ceiling counting weights + K/V + recurrent state read and written per step.

    python tools/bench_hybrid_cpu.py [--models qwen3_5,mamba2,kimi] [--iters 3] [--gen 32]

Not a test: it takes minutes per model on 2 cores. Figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {
    # ~0.45B: 24 layers, 3 Gated DeltaNet : 1 gated full attention (Qwen3.5's ratio).
    "qwen3_5": (
        "qwen3_5_text",
        {
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 24,
            "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 128,
            "linear_num_key_heads": 8,
            "linear_num_value_heads": 16,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
        },
    ),
    # ~0.42B: 64 Mamba2 layers (expand 2, 32 heads of 64, d_state 128).
    "mamba2": (
        "mamba2",
        {
            "hidden_size": 1024,
            "num_heads": 32,
            "head_dim": 64,
            "state_size": 128,
            "n_groups": 1,
            "num_hidden_layers": 64,
            "chunk_size": 64,
            "time_step_rank": 64,
        },
    ),
    # ~0.5B: 16 layers, 3 KDA : 1 MLA, a dense first layer then MoE (16 experts, top 2).
    "kimi": (
        "kimi_linear",
        {
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "moe_intermediate_size": 768,
            "num_hidden_layers": 16,
            "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            "mlp_layer_types": ["dense"] + ["sparse"] * 15,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "kv_lora_rank": 256,
            "qk_rope_head_dim": 32,
            "qk_nope_head_dim": 64,
            "v_head_dim": 128,
            "linear_head_dim": 128,
            "linear_num_heads": 8,
            "num_local_experts": 16,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
        },
    ),
}


def _tile(values: dict) -> dict:
    """Repeat a layer-type pattern over every layer (configs want one entry per layer)."""
    out = dict(values)
    layers = out["num_hidden_layers"]
    for key in ("layer_types", "mlp_layer_types"):
        if key in out and len(out[key]) < layers:
            out[key] = (out[key] * layers)[:layers]
    return out


SHAPES = {name: (model_type, _tile(values)) for name, (model_type, values) in SHAPES.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(SHAPES))
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--json", metavar="FILE", help="also write every report here")
    args = parser.parse_args()

    from pypto_bench import BenchConfig, run_bench
    from pypto_testing.architectures import make_tiny_architecture

    rows, reports = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            model_type, values = SHAPES[name]
            path = make_tiny_architecture(Path(tmp) / name, model_type, **values)
            start = time.perf_counter()
            report = run_bench(
                BenchConfig(
                    model_path=str(path),
                    device="cpu",
                    regime="decode",
                    arms=("eager", "graph", "hf-compile"),
                    seq=args.seq,
                    gen=args.gen,
                    warmup=args.warmup,
                    iters=args.iters,
                    ignore_eos=True,
                )
            )
            data = report.to_dict()
            reports[name] = data
            roof = data.get("roofline") or {}
            for arm in data["arms"]:
                tps = arm["tokens_per_s"]
                r = arm.get("roofline") or {}
                rows.append(
                    {
                        "model": name,
                        "arm": arm["name"],
                        "ok": arm["ok"],
                        "median": tps.get("median"),
                        "min": min(tps["samples"]) if tps.get("samples") else None,
                        "max": max(tps["samples"]) if tps.get("samples") else None,
                        "x_eager": arm.get("ratio_to_eager"),
                        "x_peer": arm.get("ratio_to_peer"),
                        "match": (arm.get("token_match") or {}).get("rate"),
                        "bw_share": r.get("fraction_of_bandwidth_ceiling"),
                        "error": arm.get("error"),
                    }
                )
            print(
                f"{name}: weights {roof.get('weight_bytes', 0) / 2**20:.0f} MiB, state "
                f"{roof.get('state_bytes', 0) / 2**20:.2f} MiB, kv/token "
                f"{roof.get('kv_bytes_per_token', 0)} B, bandwidth "
                f"{(roof.get('bandwidth_bytes_per_s') or 0) / 1e9:.1f} GB/s, noise "
                f"{'NOISY' if (data.get('noise') or {}).get('noisy') else 'ok'}, {time.perf_counter() - start:.0f} s",
                file=sys.stderr,
            )
    print(
        "| model | arm | tok/s median [min, max] | x eager | x hf-compile | match | share of bandwidth ceiling |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if not r["ok"]:
            print(f"| {r['model']} | {r['arm']} | failed: {r['error']} | | | | |")
            continue
        share = f"{r['bw_share']:.0%}" if r["bw_share"] is not None else "-"
        match = f"{r['match']:.0%}" if r["match"] is not None else "-"
        print(
            f"| {r['model']} | {r['arm']} | {r['median']:.1f} [{r['min']:.1f}, {r['max']:.1f}] | "
            f"{r['x_eager']:.2f} | {r['x_peer']:.2f} | {match} | {share} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
