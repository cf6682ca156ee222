#!/usr/bin/env python3
"""Load the shipped demo model the way the demo does and print greedy continuations.

Why: the demo's smoke gate depends on this folder giving readable text when
loaded with ``from_pretrained(local_files_only=True)`` in float32 on CPU; this
script checks exactly that in a few seconds (it does not train anything).

    python tools/check_demo_model.py                 # human-readable, on stderr
    python tools/check_demo_model.py --json          # one JSON document on stdout
    python tools/check_demo_model.py PATH --prompt "The LORD said"

Exit codes: 0 ok, 1 output is degenerate (too repetitive), 2 no model folder at
PATH, 3 torch/transformers missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_demo_model import DEFAULT_OUT, PROMPTS, readability


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", nargs="?", type=Path, default=DEFAULT_OUT, help="model folder")
    p.add_argument("--prompt", action="append", help="prompt (repeatable; default: 3 built-in)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--min-variety", type=float, default=0.25)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    args = p.parse_args(argv)

    if not (args.path / "config.json").is_file():
        print(
            f"error: no model folder at {args.path} (config.json missing); pass its path",
            file=sys.stderr,
        )
        return 2
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        print(f"error: {err}; install torch and transformers", file=sys.stderr)
        return 3

    torch.set_num_threads(2)
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(args.path, local_files_only=True).eval()
    load_s = time.perf_counter() - t0
    prompts = args.prompt or PROMPTS
    outputs = []
    t1 = time.perf_counter()
    with torch.no_grad():
        for prompt in prompts:
            enc = tokenizer(prompt, return_tensors="pt")
            gen = model.generate(**enc, do_sample=False, max_new_tokens=args.max_new_tokens)
            outputs.append(tokenizer.decode(gen[0], skip_special_tokens=True))
    gen_s = time.perf_counter() - t1
    variety = readability(prompts, outputs)
    n_params = sum(p.numel() for p in model.parameters())
    result = {
        "path": str(args.path),
        "architecture": type(model).__name__,
        "parameters": n_params,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "load_s": round(load_s, 3),
        "generate_s": round(gen_s, 3),
        "word_variety": round(variety, 3),
        "samples": [{"prompt": p, "output": o} for p, o in zip(prompts, outputs, strict=True)],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['architecture']} {n_params / 1e6:.2f} M params, {result['dtype']}, "
            f"load {load_s:.2f} s, generate {gen_s:.2f} s, word variety {variety:.2f}",
            file=sys.stderr,
        )
        for prompt, out in zip(prompts, outputs, strict=True):
            print(f"{prompt!r} -> {out!r}", file=sys.stderr)
    if variety < args.min_variety:
        print(
            f"error: greedy output is degenerate (word variety {variety:.2f} < {args.min_variety})",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
