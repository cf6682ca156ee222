"""PyPTO cost model: GQA decode attention vs the unfused eager attention (relative signal).

At Gemma-4-31B sliding-layer shapes by default (batch 1, 32 q heads, 16 KV heads,
head_dim 256, a full 1024-slot window, bf16): the fused decode kernel against the same
work as eager runs it, three kernels (scores matmul, softmax, value matmul) with the
scores going through memory. Simulated time = the cost model's "Total Cycles" / 1800
(us at 1.8 GHz): compare rows with each other, not with an NPU.

    python tools/bench_attention_costmodel.py [--slots 1024] [--heads 32] [--kv-heads 16]
        [--head-dim 256] [--batch 1] [--dtype bfloat16] [--json]

Exit codes: 0 printed, 2 bad arguments, 3 PyPTO's cost model cannot run here.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from pypto_kernels_attention import costmodel, kernels
from pypto_kernels_attention.package import PACKAGE
from pypto_kernels_common import sim

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    full = costmodel.GEMMA4_31B_SLIDING
    ap.add_argument("--batch", type=int, default=full.batch)
    ap.add_argument("--heads", type=int, default=full.heads)
    ap.add_argument("--kv-heads", type=int, default=full.kv_heads)
    ap.add_argument("--slots", type=int, default=full.slots, help="cache slots (the window)")
    ap.add_argument("--head-dim", type=int, default=full.head_dim)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--json", action="store_true", help="rows as JSON on stdout")
    args = ap.parse_args(argv)
    shape = kernels.DecodeShape(args.batch, args.heads, args.kv_heads, args.slots, args.head_dim)
    if min(shape.batch, shape.heads, shape.kv_heads, shape.slots, shape.head_dim) < 1:
        ap.error("every size must be >= 1")
    if shape.heads % shape.kv_heads or shape.slots % 16 or shape.head_dim % 16:
        ap.error("--heads must be a multiple of --kv-heads; --slots and --head-dim multiples of 16")
    try:
        sim.check_compiler()
        sim.import_pypto(PACKAGE.install_hint)
    except sim.SimUnavailableError as err:
        print(f"bench_attention_costmodel: {err}", file=sys.stderr)
        return 3
    torch.set_num_threads(1)
    rows = costmodel.compare_decode(shape, DTYPES[args.dtype])
    reduced = shape != full
    meta = {
        "shape": {
            "batch": shape.batch,
            "heads": shape.heads,
            "kv_heads": shape.kv_heads,
            "slots": shape.slots,
            "head_dim": shape.head_dim,
        },
        "dtype": args.dtype,
        "shapes": "reduced" if reduced else "full (Gemma-4-31B sliding layer)",
    }
    if args.json:
        print(json.dumps({**meta, "rows": rows}, indent=1))
        return 0
    fused = rows[0]["sim_us"]
    print(
        f"GQA decode attention, PyPTO cost model ({meta['shapes']}: B={shape.batch} "
        f"H={shape.heads} KV={shape.kv_heads} S={shape.slots} D={shape.head_dim} {args.dtype})"
    )
    print("| kernel | simulated us | vs fused | wall s |")
    print("|---|---:|---:|---:|")
    for r in rows:
        wall = "" if r["wall_s"] is None else f"{r['wall_s']:.1f}"
        print(f"| {r['kernel']} | {r['sim_us']:.1f} | {r['sim_us'] / fused:.2f}x | {wall} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
