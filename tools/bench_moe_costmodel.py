"""PyPTO cost model: grouped-GEMM MoE experts vs the per-expert loop vs dense experts.

A relative signal at fixed shapes (simulated "Total Cycles" / 1800 = us on a 910B-class
core array), not an NPU time. Decode: batch 1, top-8, at MiniMax-M2 (hidden 3072,
expert intermediate 1536) and LLaDA2.0-mini (hidden 2048, expert intermediate 512).

* grouped: one launch of ``pypto_kernels_moe.kernels.grouped_gemm_kernel`` (all k slots;
  expert weights viewed at the device-side ids).
* per-expert loop: what transformers' eager experts do, one launch of one expert's
  SwiGLU MLP per hit expert (k launches of 1 row at decode), cycles summed. The loop's
  own routing work (one_hot, nonzero, host sync) is not modelled: this favours it.
* dense: every expert over every token (the fixed-shape "dense-masked" fallback): E
  launches of the same one-expert MLP, cycles = E x one launch (derived, not simulated E
  times: the launches are identical).

Each simulated kernel gets the best of its own tile search over the same candidates
(cube_k L0/L1 depth x cube_n, each kernel shrinking the L1 depth to divide its matmul
depths, ``kernels.fit_k``); ``--no-search`` runs the package defaults only
(``GROUPED_TILES``, ``PER_EXPERT_TILES``). The search is printed. Expert weights are
stacked with 16 experts in the simulated calls: the grouped kernel reads only the
selected ones, so the count does not change its cycles.

Prefill (``--mode prefill``, 512 tokens, top-8, package default tiles): the
expert-major kernel (one launch; rows grouped by expert, each expert's weights read
once per row tile) vs the token-major grouped kernel (one launch, every token reads
its k experts) vs the per-expert loop (one launch per hit expert over its rows) vs dense
(every expert over every token). Routing is round-robin (every expert gets
tokens x k / experts rows, a balanced router's mean). MiniMax-M2 runs reduced (64
stacked experts, 128 tokens: the same 16 rows per expert; 256 experts' zeros are 7 GB),
marked in the table.

    python tools/bench_moe_costmodel.py [--json] [--no-search] [--models minimax_m2,llada2_mini]
    python tools/bench_moe_costmodel.py --mode prefill [--models ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from pypto_kernels_common import sim as pypto_sim
from pypto_kernels_common.costmodel import cube_fits
from pypto_kernels_moe.costmodel import MoESimulator
from pypto_kernels_moe.kernels import EXPERT_MAJOR_TILES, GROUPED_TILES, PER_EXPERT_TILES, Tiles
from pypto_kernels_moe.package import INSTALL_HINT

MODELS = {
    "minimax_m2": {"hidden": 3072, "inter": 1536, "experts": 256, "top_k": 8},
    "llada2_mini": {"hidden": 2048, "inter": 512, "experts": 256, "top_k": 8},
}


#: (cube_k L0, cube_k L1) x cube_n searched for both kernels (bf16; filtered by the L0/L1
#: sizes). The wider search of issue #15 (merge counts, vector tiles, gate and up as two
#: matmuls, the loop structure) is recorded in docs/benchmarks.md.
CUBE_K = ((64, 256), (64, 512), (64, 768), (128, 512), (128, 1024), (128, 1536))
CUBE_N = (128, 256)


def candidates(search: bool, default: Tiles) -> list[Tiles]:
    if not search:
        return [default]
    out = []
    for k0, k1 in CUBE_K:
        for n in CUBE_N:
            if cube_fits(16, k0, k1, n, 2):
                out.append(dataclasses.replace(default, cube_k=(k0, k1), cube_n=(n, n)))
    return out


def best(
    sim: MoESimulator, kernel: str, shape: dict[str, int], tiles: list[Tiles]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    tried = []
    for t in tiles:
        r = sim.simulate(kernel, shape, "bf16", t).to_dict()
        tried.append(r)
        print(
            f"  {kernel:10s} cube_k={t.cube_k[0]}/{t.cube_k[1]:<4d} cube_n={t.cube_n[0]:<4d} "
            + (f"{r['sim_us']:9.1f} us" if r["ok"] else f"failed: {r['error']}"),
            file=sys.stderr,
        )
    ok = [r for r in tried if r["ok"]]
    if not ok:
        raise SystemExit(
            f"bench_moe_costmodel: every tiling of {kernel} failed: {tried[0]['error']}"
        )
    return min(ok, key=lambda r: r["sim_us"]), tried


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON on stdout")
    ap.add_argument("--no-search", action="store_true", help="package default tiles only")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    ap.add_argument("--tokens", type=int, default=1, help="decode batch (default 1)")
    ap.add_argument("--mode", choices=("decode", "prefill"), default="decode")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per simulated call")
    args = ap.parse_args()
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        print(
            f"bench_moe_costmodel: unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}",
            file=sys.stderr,
        )
        return 2
    reason = pypto_sim.availability(install_hint=INSTALL_HINT)
    if reason:
        print(f"bench_moe_costmodel: {reason}", file=sys.stderr)
        return 3
    if args.mode == "prefill":
        return prefill(names, args.json, args.timeout)
    rows = []
    with MoESimulator(timeout_s=600) as sim:
        for name in names:
            m = MODELS[name]
            h, i, k, e, n = m["hidden"], m["inter"], m["top_k"], m["experts"], args.tokens
            print(
                f"{name}: tokens {n}, top-{k} of {e}, hidden {h}, expert intermediate {i}",
                file=sys.stderr,
            )
            g, g_tried = best(
                sim,
                "grouped",
                {"tokens": n, "top_k": k, "hidden": h, "inter": i, "experts": 16},
                candidates(not args.no_search, GROUPED_TILES),
            )
            # Decode: each hit expert has n rows at most (1 at batch 1).
            p, p_tried = best(
                sim,
                "per_expert",
                {"rows": n, "hidden": h, "inter": i},
                candidates(not args.no_search, PER_EXPERT_TILES),
            )
            hit = min(e, n * k)
            loop_us = hit * p["sim_us"]
            dense_us = e * p["sim_us"]
            rows.append(
                {
                    "model": name,
                    "tokens": n,
                    "top_k": k,
                    "experts": e,
                    "hidden": h,
                    "inter": i,
                    "grouped_us": round(g["sim_us"], 1),
                    "grouped_tiles": g["tiles"],
                    "per_expert_loop_us": round(loop_us, 1),
                    "per_expert_launch_us": round(p["sim_us"], 1),
                    "per_expert_tiles": p["tiles"],
                    "dense_us": round(dense_us, 1),
                    "loop_over_grouped": round(loop_us / g["sim_us"], 2),
                    "dense_over_grouped": round(dense_us / g["sim_us"], 2),
                    "search": {
                        "grouped": [
                            (r["tiles"]["cube_k"], r["tiles"]["cube_n"][0], r["sim_us"])
                            for r in g_tried
                        ],
                        "per_expert": [
                            (r["tiles"]["cube_k"], r["tiles"]["cube_n"][0], r["sim_us"])
                            for r in p_tried
                        ],
                    },
                }
            )
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        "| model | shape (decode) | grouped (1 launch) | per-expert loop (k launches) | dense (E launches) | loop / grouped | dense / grouped |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['model']} | {r['tokens']} tok, top-{r['top_k']}/{r['experts']}, H {r['hidden']}, I {r['inter']} "
            f"| {r['grouped_us']} us | {r['per_expert_loop_us']} us ({r['top_k']} x {r['per_expert_launch_us']}) "
            f"| {r['dense_us']} us | {r['loop_over_grouped']}x | {r['dense_over_grouped']}x |"
        )
    print(
        "\nPyPTO 0.2.0 cost model (SIM), bf16; a relative signal at fixed shapes, not an NPU time."
    )
    return 0


#: Prefill shapes simulated: (tokens, stacked experts, note); full size where it fits.
PREFILL = {
    "minimax_m2": (128, 64, "reduced: 128 tok x 64 experts (16 rows/expert, as at 512 x 256)"),
    "llada2_mini": (512, 256, "full"),
}


def _one(sim: MoESimulator, kernel: str, shape: dict[str, int]) -> float | None:
    tiles = {"expert_major": EXPERT_MAJOR_TILES, "per_expert": PER_EXPERT_TILES}.get(
        kernel, GROUPED_TILES
    )
    r = sim.simulate(kernel, shape, "bf16", tiles)
    print(
        f"  {kernel:12s} {shape} "
        + (f"{r.sim_us:10.1f} us ({r.wall_s:.0f} s)" if r.ok else f"failed: {r.error}"),
        file=sys.stderr,
    )
    return r.sim_us if r.ok else None


def prefill(names: list[str], as_json: bool, timeout: float) -> int:
    rows = []
    with MoESimulator(timeout_s=timeout) as sim:
        for name in names:
            m = MODELS[name]
            h, i, k = m["hidden"], m["inter"], m["top_k"]
            n, e, note = PREFILL[name]
            per = n * k // e
            print(f"{name}: prefill {n} tokens, top-{k} of {e}, {per} rows/expert", file=sys.stderr)
            em = _one(
                sim,
                "expert_major",
                {"tokens": n, "top_k": k, "hidden": h, "inter": i, "experts": e},
            )
            one = _one(sim, "per_expert", {"rows": per, "hidden": h, "inter": i})
            full = _one(sim, "per_expert", {"rows": n, "hidden": h, "inter": i})
            tm = _one(
                sim, "grouped", {"tokens": n, "top_k": k, "hidden": h, "inter": i, "experts": 16}
            )
            rows.append(
                {
                    "model": name,
                    "shape": note,
                    "tokens": n,
                    "experts": e,
                    "expert_major_us": em,
                    "token_major_us": tm,
                    "per_expert_loop_us": None if one is None else e * one,
                    "dense_us": None if full is None else e * full,
                }
            )
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0

    def f(v: float | None) -> str:
        return "failed" if v is None else f"{v:.1f} us"

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or b is None else f"{a / b:.2f}x"

    print(
        "| model | prefill shape | expert-major (1 launch) | token-major grouped (1 launch) "
        "| per-expert loop (E launches) | dense (E launches) | token-major / expert-major "
        "| loop / expert-major |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        em = r["expert_major_us"]
        print(
            f"| {r['model']} | {r['shape']} | {f(em)} | {f(r['token_major_us'])} "
            f"| {f(r['per_expert_loop_us'])} | {f(r['dense_us'])} "
            f"| {ratio(r['token_major_us'], em)} | {ratio(r['per_expert_loop_us'], em)} |"
        )
    print("\nPyPTO 0.2.0 cost model (SIM), bf16, top-8; a relative signal, not an NPU time.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
