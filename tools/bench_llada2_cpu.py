#!/usr/bin/env python3
"""LLaDA2 block-diffusion generation: full-prefix recompute vs block KV cache vs captured step.

A LLaDA2-MoE model with random weights (no download), LLaDA2.0-mini's structure scaled to
about 0.5B parameters: the real 157184-token vocabulary, hidden 512, 14 layers (layer 0
dense), 8 query / 2 KV heads of 64 with half-rotary and qk-norm, 128 routed experts of
128 (top-8 from 4 of 8 groups, sigmoid router with expert bias, routed scaling 2.5) plus
one shared expert.

Arms, same prompt, same generation settings (greedy, threshold 0.95, block 32, 32 steps
per block, no EOS stop), all in this process:

* ``full-recompute``: the published schedule: every denoising step is a forward over the
  whole prefix with the block-causal mask, logits for every position, and the published
  per-expert MoE loop (host-side counts);
* ``cached``: the block KV cache, every step one block against it, run eagerly;
* ``cached+graph``: the same one-block step captured once with pypto-capture
  (``compile`` on CPU: inductor with frozen weights; ``auto`` picks cudagraph on CUDA) and
  replayed for every step of every block; experts run the model's fixed-shape schedule
  (compiled on a CPU: the fused gather; on an accelerator the dense pass once a block
  routes more pairs than there are experts);
* ``cached+graph (pypto-capture MoE)`` with ``--pypto-capture-moe``: the same, with the
  experts replaced by ``pypto_capture.apply_exact_moe`` (its dense-masked schedule when a
  block routes at least as many pairs as there are experts).

Figures per arm: seconds for one generation (a graph arm's step is captured first, outside
the timing: ``capture_s``), generated tokens/s, tokens per denoising forward (TPF), denoising forwards per
second (FPS), all forward passes (the cache's fills included), and whether the tokens equal
the full-recompute arm's. With random weights no confidence passes 0.95, so every step
commits exactly one position: TPF is 1 and NFE = gen, the worst case for diffusion decoding.

    python tools/bench_llada2_cpu.py                       # gen 256, block 32, CPU fp32
    python tools/bench_llada2_cpu.py --gen 128 --json
    python tools/bench_llada2_cpu.py --device cuda --dtype bfloat16 --backend auto

Exit codes: 0 ok, 1 an arm failed or tokens differ, 2 bad usage, 3 environment missing.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any

CONFIG: dict[str, Any] = {
    "vocab_size": 157184,
    "hidden_size": 512,
    "intermediate_size": 1280,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 14,
    "first_k_dense_replace": 1,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "partial_rotary_factor": 0.5,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_shared_experts": 1,
    "n_group": 8,
    "topk_group": 4,
    "routed_scaling_factor": 2.5,
    "max_position_embeddings": 4096,
    "pad_token_id": 156892,
    "eos_token_id": 156892,
    "mask_token_id": 156895,
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gen", type=int, default=256, help="generated positions (default 256)")
    p.add_argument("--block", type=int, default=32, help="block length (default 32)")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens (default 32)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--backend", default="compile", help="pypto-capture backend of the graph arm")
    p.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0: torch's)")
    p.add_argument(
        "--pypto-capture-moe",
        action="store_true",
        help="add the arm with pypto-capture's exact MoE",
    )
    p.add_argument("--skip-full", action="store_true", help="skip the (slow) full-recompute arm")
    p.add_argument("--json", action="store_true", help="stdout: one JSON document")
    args = p.parse_args(argv)
    for name in ("gen", "block", "prompt", "batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    return args


def _arm(model: Any, ids: Any, sync: Any, **kw: Any) -> dict[str, Any]:
    """One timed generation; a graph arm's step is captured first, outside the timing."""
    from pypto_models_llada2 import block_diffusion_generate, prepare_step

    capture_s = None
    if kw.get("step_backend") is not None:
        t0 = time.perf_counter()
        prepare_step(
            model,
            batch_size=ids.shape[0],
            prompt_length=ids.shape[1],
            gen_length=kw["gen_length"],
            block_length=kw["block_length"],
            step_backend=kw["step_backend"],
        )
        sync()
        capture_s = time.perf_counter() - t0
    sync()
    t0 = time.perf_counter()
    out = block_diffusion_generate(model, ids, **kw)
    sync()
    seconds = time.perf_counter() - t0
    tokens = sum(out.tokens_per_row())
    return {
        "path": out.path,
        "seconds": seconds,
        "capture_s": capture_s,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "denoising_forwards": out.num_denoising_steps,
        "forward_passes": out.num_forward_passes,
        "tpf": tokens / out.num_denoising_steps,
        "fps": out.num_denoising_steps / seconds,
        "steps_per_block": out.steps_per_block,
        "_sequences": out.sequences,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        import torch

        import pypto_models_llada2 as llada2
        from pypto_capture import apply_exact_moe, make_backend, resolve_device, synchronize
    except ImportError as err:
        print(
            f"bench_llada2_cpu: {err}: install pypto-models-llada2 and pypto-capture",
            file=sys.stderr,
        )
        return 3
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        device = resolve_device(args.device)
    except Exception as err:
        print(f"bench_llada2_cpu: device {args.device!r}: {err}", file=sys.stderr)
        return 3
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    config = llada2.LLaDA2MoeConfig(**CONFIG)
    model = llada2.LLaDA2MoeModelLM(config).to(device=device, dtype=dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(
        0, 150000, (args.batch, args.prompt), generator=torch.Generator().manual_seed(1)
    )
    ids = ids.to(device)
    common = {
        "gen_length": args.gen,
        "block_length": args.block,
        "steps_per_block": args.block,
        "threshold": 0.95,
        "eos_early_stop": False,
    }

    def sync() -> None:
        synchronize(device)

    arms: dict[str, dict[str, Any]] = {}
    plan: list[tuple[str, dict[str, Any], bool]] = []
    if not args.skip_full:
        plan.append(("full-recompute", {"use_cache": False}, False))
    plan.append(("cached", {"use_cache": True}, False))
    plan.append(("cached+graph", {"step_backend": make_backend(args.backend, device)}, False))
    if args.pypto_capture_moe:
        plan.append(
            (
                "cached+graph (pypto-capture MoE)",
                {"step_backend": make_backend(args.backend, device)},
                True,
            )
        )
    failed = False
    with torch.inference_mode():
        for name, kw, exact_moe in plan:
            print(f"bench_llada2_cpu: running {name} ...", file=sys.stderr, flush=True)
            try:
                if exact_moe:
                    with apply_exact_moe(model):
                        arms[name] = _arm(model, ids, sync, **common, **kw)
                else:
                    arms[name] = _arm(model, ids, sync, **common, **kw)
            except Exception as err:
                failed = True
                arms[name] = {"error": f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"}
    ref_name = "full-recompute" if "full-recompute" in arms else "cached"
    ref = arms.get(ref_name, {}).get("_sequences")
    for arm in arms.values():
        seqs = arm.pop("_sequences", None)
        if seqs is not None and ref is not None:
            arm["tokens_equal_reference"] = bool(torch.equal(seqs, ref))
            failed |= not arm["tokens_equal_reference"]
    base = arms.get("full-recompute", {}).get("tokens_per_s")
    for arm in arms.values():
        if base and "tokens_per_s" in arm:
            arm["x_full_recompute"] = arm["tokens_per_s"] / base
    result = {
        "tool": "bench_llada2_cpu",
        "command": " ".join(["python", "tools/bench_llada2_cpu.py", *(argv or sys.argv[1:])]),
        "host": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "model": {
            "parameters": params,
            "config": CONFIG,
            "dtype": args.dtype,
            "device": str(device),
        },
        "settings": {**common, "prompt": args.prompt, "batch": args.batch, "backend": args.backend},
        "reference": ref_name,
        "arms": arms,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"LLaDA2-shaped MoE, {params / 1e6:.0f}M parameters, {args.dtype} on {device}; "
            f"prompt {args.prompt}, gen {args.gen}, block {args.block}, batch {args.batch}"
        )
        print(
            f"{'arm':34} {'s':>8} {'tok/s':>8} {'TPF':>5} {'FPS':>7} {'fwd':>5} {'x full':>7}  same tokens"
        )
        for name, arm in arms.items():
            if "error" in arm:
                print(f"{name:34} FAILED: {arm['error']}")
                continue
            x = arm.get("x_full_recompute")
            print(
                f"{name:34} {arm['seconds']:8.2f} {arm['tokens_per_s']:8.2f} {arm['tpf']:5.2f} "
                f"{arm['fps']:7.2f} {arm['forward_passes']:5d} {'-' if x is None else f'{x:7.2f}':>7}  "
                f"{arm.get('tokens_equal_reference', '-')}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
