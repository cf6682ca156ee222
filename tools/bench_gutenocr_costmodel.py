"""PyPTO cost model at GutenOCR shapes (a relative signal, not a timed test).

Prints, side by side from one run: the fused SwiGLU MLP vs the same work as three
separate kernels, and each kernel's simulated AICore time across a few tile
shapes. Simulated time = "Total Cycles" of the cost model / 1800 (us at 1.8 GHz).
Everything goes through ``pypto_kernels_gutenocr.costmodel`` (the same code as
``pypto-tune tile-search``); for a search over tile shapes use that command.

    python tools/bench_gutenocr_costmodel.py [--rows 16] [--inter 11008] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from pypto_kernels_gutenocr import costmodel as cm
from pypto_kernels_gutenocr import kernels
from pypto_kernels_gutenocr.kernels import Tiles


def _in_process(fn, *args) -> tuple[float, float]:
    """(simulated us, wall s) of one call known to compile, measured in this process."""
    cycles, wall = cm.measure(fn, *args)
    if cycles is None:
        raise RuntimeError("the cost model wrote no Total Cycles for a kernel call")
    return cycles / cm.CYCLES_PER_US, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16, help="MLP rows N (tokens)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=11008)
    ap.add_argument("--rms-rows", type=int, default=1024, help="RMSNorm rows (default 1024)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    reason = cm.availability()
    if reason:
        print(f"bench_gutenocr_costmodel: {reason}", file=sys.stderr)
        return 3
    torch.set_num_threads(1)
    bk = cm.cost_backend()
    bf = torch.bfloat16
    h, i, n = args.hidden, args.inter, args.rows
    mlp_shape = {"rows": n, "hidden": h, "inter": i}
    rows: list[dict] = []

    # Inputs are zeros: the cost model's cycles do not depend on the data.
    x = torch.zeros(n, h, dtype=bf)
    wg = wu = torch.zeros(h, i, dtype=bf)
    wd = torch.zeros(i, h, dtype=bf)
    out = torch.empty_like(x)
    tiles = cm.default_tiles("swiglu_mlp", "bf16")
    fused_us, fused_wall = _in_process(
        kernels.swiglu_mlp_kernel(bk, h, i, bf, tiles), x, wg, wu, wd, out
    )
    gate_up, act, down = kernels.swiglu_split_kernels(bk, h, i, bf, tiles)
    g, u, a = (torch.zeros(n, i, dtype=bf) for _ in range(3))
    split = [
        _in_process(gate_up, x, wg, wu, g, u),
        _in_process(act, g, u, a),
        _in_process(down, a, wd, out),
    ]
    split_us = sum(s[0] for s in split)
    rows.append(
        {
            "bench": "swiglu fused vs split",
            "shape": f"{n}x{h}x{i}",
            "fused_us": fused_us,
            "split_us": split_us,
            "split_parts_us": [s[0] for s in split],
            "fused_over_split": fused_us / split_us if split_us else None,
            "wall_s": fused_wall + sum(s[1] for s in split),
        }
    )

    # Tile variants run in the cost model's worker: a tiling that fails to compile
    # is reported instead of breaking this process.
    with cm.Simulator() as sim:
        for name, t in {
            "cube m32 k128/512 n256 (default)": tiles,
            "cube m64 k128 n128": Tiles(
                rows=64,
                vec_rows=16,
                vec_cols=512,
                cube_m=(64, 64),
                cube_k=(128, 128),
                cube_n=(128, 128),
            ),
        }.items():
            res = sim.simulate("swiglu_mlp", mlp_shape, "bf16", t)
            rows.append(
                {
                    "bench": "swiglu tiles",
                    "tiles": name,
                    "shape": f"{n}x{h}x{i}",
                    "sim_us": res.sim_us,
                    "wall_s": res.wall_s,
                    "error": res.error,
                }
            )

        rms_shape = {"rows": args.rms_rows, "hidden": h}
        for vr in (1, 4, 8):
            res = sim.simulate("rms_norm", rms_shape, "bf16", Tiles(rows=8, vec_rows=vr))
            rows.append(
                {
                    "bench": "rms_norm tiles",
                    "tiles": f"vec rows {vr}",
                    "shape": f"{args.rms_rows}x{h}",
                    "sim_us": res.sim_us,
                    "wall_s": res.wall_s,
                    "error": res.error,
                }
            )

    for s in (1, 64):
        q, k = torch.zeros(1, 16, s, 128, dtype=bf), torch.zeros(1, 2, s, 128, dtype=bf)
        cos, sin = torch.zeros(3, 1, s, 128, dtype=bf), torch.zeros(3, 1, s, 128, dtype=bf)
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        us, wall = _in_process(
            kernels.mrope_kernel(bk, 1, 16, 2, s, 128, (16, 24, 24), bf), q, k, cos, sin, qo, ko
        )
        rows.append(
            {
                "bench": "mrope",
                "shape": f"q[1,16,{s},128] k[1,2,{s},128]",
                "sim_us": us,
                "wall_s": wall,
            }
        )

    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
