#!/usr/bin/env python3
"""pypto-tune on CPU: profiler overhead side by side, and the advise -> verify loop.

Two models with seeded random weights (timing does not depend on the values): the tiny
llama of pypto-testing (hidden 64, 2 layers) and a Qwen2.5-0.5B-shaped qwen2 (hidden
896, 24 layers, GQA 14/2, vocab 151936), fp32, decode, batch 1.

1. Overhead: one bench iteration of the eager arm (a ``generate`` of --gen tokens) timed
   with no profiler, under pypto-tune's ``light`` profile (torch.profiler + module scopes)
   and under ``detail`` (shapes, memory, stacks, FLOPs), the three interleaved round by
   round so machine noise hits all of them; medians compared. The profiler's start/stop
   and the trace's conversion happen outside the timed span and are reported apart.
2. Loop: profile the eager arm, take the top recommendation, profile the arm it names,
   and compare the measured step speedup with the estimate.

    python tools/bench_tune_cpu.py [--workdir DIR] [--rounds 5] [--skip-05b] [--write]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## pypto-tune"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e_cpu import tool_models, write_section  # noqa: E402  (the tools share the models and the doc writer)


def _config(path: Path, gen: int):
    from pypto_bench import BenchConfig

    return BenchConfig(
        model_path=str(path), device="cpu", regime="decode", seq=16, gen=gen, ignore_eos=True
    )


def overhead(path: Path, *, gen: int, rounds: int) -> dict:
    import torch

    from pypto_bench import open_session
    from pypto_tune import ModuleScopes, profile

    session = open_session(_config(path, gen))
    times: dict[str, list[float]] = {"none": [], "profiler": [], "light": [], "detail": []}
    post: dict[str, list[float]] = {"profiler": [], "light": [], "detail": []}
    with session.iteration("eager") as once:
        once()
        for _ in range(rounds):
            for level in ("none", "profiler", "light", "detail"):
                if level == "none":
                    t = time.perf_counter()
                    once()
                    times[level].append(time.perf_counter() - t)
                    continue
                # "profiler": torch.profiler at the light level without module scopes,
                # to split the overhead between the profiler and the attribution.
                with ModuleScopes(session.model) if level != "profiler" else nullcontext():
                    p = profile(level="light" if level == "profiler" else level, device="cpu")
                    got = p.__enter__()
                    t = time.perf_counter()
                    with torch.profiler.record_function("pypto_tune.iteration"):
                        once()
                    times[level].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    p.__exit__(None, None, None)
                    assert got.trace is not None
                    post[level].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "iteration_s": med,
        "profiler_overhead": med["profiler"] / med["none"] - 1,
        "light_overhead": med["light"] / med["none"] - 1,
        "detail_overhead": med["detail"] / med["none"] - 1,
        "postprocess_s": {k: statistics.median(v) for k, v in post.items()},
        "samples": times,
    }


def loop(path: Path, *, gen: int, iters: int) -> dict:
    from pypto_tune import advise, compare_profiles, profile_model

    base = advise(profile_model(_config(path, gen), arm="eager", level="light", iters=iters))
    top = base.recommendations[0]
    arm = (top.get("applies_when") or {}).get("arm", ["graph"])[0]
    opt = advise(profile_model(_config(path, gen), arm=arm, level="light", iters=iters))
    result = compare_profiles(base, opt, applied=[top["id"]])
    check = result["predictions"][0]
    return {
        "top": top["id"],
        "basis": top["basis"],
        "arm": arm,
        "eager_step_us": base.step_us,
        "opt_step_us": opt.step_us,
        "predicted": check["predicted"],
        "measured": check["measured"],
        "factor": check["factor"],
        "came_true": check["came_true"],
        "eager_findings": [f["id"] for f in base.findings],
    }


def _markdown(rows: list[dict], rounds: int, argv: list[str]) -> str:
    lines = [
        SECTION,
        "",
        f"Command: `python tools/bench_tune_cpu.py {' '.join(argv)}` on {platform.processor() or platform.machine()}"
        f" ({__import__('os').cpu_count()} cores, shared), torch {__import__('torch').__version__}; "
        f"decode, batch 1, seq 16, fp32, eager arm; medians of {rounds} interleaved rounds.",
        "",
        "Profiler overhead on one bench iteration (the timed span holds only the step; the "
        "profiler's start/stop and trace conversion are after it):",
        "",
        "| model | no profiler | torch.profiler alone | light (+ module scopes) | overhead | detail | overhead | convert light / detail |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        o = r["overhead"]
        it = o["iteration_s"]
        lines.append(
            f"| {r['model']} | {it['none'] * 1e3:.1f} ms | {it['profiler'] * 1e3:.1f} ms "
            f"({o['profiler_overhead']:+.1%}) | {it['light'] * 1e3:.1f} ms | "
            f"{o['light_overhead']:+.1%} | {it['detail'] * 1e3:.1f} ms | {o['detail_overhead']:+.1%} | "
            f"{o['postprocess_s']['light']:.2f} s / {o['postprocess_s']['detail']:.2f} s |"
        )
    lines += [
        "",
        "The loop: the eager arm's top recommendation, applied (the arm it names) and re-profiled:",
        "",
        "| model | top recommendation | eager step | after | predicted | measured | within |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lp = r["loop"]
        lines.append(
            f"| {r['model']} | {lp['top']} ({lp['arm']} arm) | {lp['eager_step_us'] / 1e3:.2f} ms | "
            f"{lp['opt_step_us'] / 1e3:.2f} ms | {lp['predicted']:.2f}x | {lp['measured']:.2f}x | "
            f"{lp['factor']:.2f}x ({'came true' if lp['came_true'] else 'missed'}) |"
        )
    lines += [
        "",
        "Light mode's per-operator cost is what a Python-dispatched step pays per recorded "
        "operator and module scope, so its share is largest where operators are smallest (the "
        "tiny model) and shrinks as operators grow; the seed's <= 3% claim is for "
        "operator-level NPU profiling, whose recording is on the device.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--skip-05b", action="store_true")
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-tune-"))
    work.mkdir(parents=True, exist_ok=True)
    models = tool_models(work, big=not args.skip_05b, gens=(32, 16))
    rows = []
    for name, path, gen in models:
        # The loop first: after the overhead rounds (many profiler sessions in this
        # process) the first compiled step was seen to cost ~6 ms in the compiled region's
        # own time (0.25 ms in a fresh process); not understood, so kept out of the loop.
        print(f"[{name}] loop ...", file=sys.stderr)
        lp = loop(path, gen=gen, iters=2)
        print(f"[{name}] overhead ...", file=sys.stderr)
        over = overhead(path, gen=gen, rounds=args.rounds)
        rows.append({"model": name, "overhead": over, "loop": lp})
        print(
            json.dumps(
                {
                    "model": name,
                    "overhead": {k: v for k, v in over.items() if k != "samples"},
                    "loop": lp,
                }
            ),
            flush=True,
        )
    argv = sys.argv[1:]
    text = _markdown(rows, args.rounds, argv)
    print(text, file=sys.stderr)
    if args.write:
        write_section(text, SECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
