"""PyPTO cost model at GutenOCR shapes (a relative signal, not a timed test).

Prints, side by side from one run: the fused SwiGLU MLP vs the same work as three
separate kernels, and each kernel's simulated AICore time across a few tile
shapes. Simulated time = "Total Cycles" of the cost model / 1800 (us at 1.8 GHz).

    python tools/bench_gutenocr_costmodel.py [--rows 16] [--inter 11008] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(tempfile.mkdtemp(prefix="gutenocr-costmodel-"))
os.environ["TILE_FWK_OUTPUT_DIR"] = str(OUT / "output")
os.environ.setdefault("ASCEND_PROCESS_LOG_PATH", str(OUT / "log"))
os.environ.setdefault("PYPTO_HOME", str(OUT / "home"))

import torch  # noqa: E402

from pypto_kernels_gutenocr import kernels  # noqa: E402
from pypto_kernels_gutenocr.kernels import Tiles  # noqa: E402

_CYCLES = re.compile(r"Total Cycles\.*:\s*(\d+)")


def _simulated_us(fn, *args) -> tuple[float, float]:
    """Run one kernel call; return (simulated us, wall s) and delete its output folder."""
    out = Path(os.environ["TILE_FWK_OUTPUT_DIR"])
    before = set(out.iterdir()) if out.exists() else set()
    t = time.perf_counter()
    fn(*args)
    wall = time.perf_counter() - t
    new = [p for p in out.iterdir() if p not in before]
    cycles = 0
    for folder in new:
        for report in folder.glob("**/_simulate.stat.report.txt"):
            m = _CYCLES.search(report.read_text())
            if m:
                cycles = max(cycles, int(m.group(1)))
        shutil.rmtree(folder, ignore_errors=True)
    return cycles / 1800.0, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16, help="MLP rows N (tokens)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=11008)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    bk = kernels.backend("cpu")
    bf = torch.bfloat16
    h, i, n = args.hidden, args.inter, args.rows
    rows: list[dict] = []

    x = torch.randn(n, h).to(bf)
    wg, wu = (torch.randn(h, i) * 0.02).to(bf), (torch.randn(h, i) * 0.02).to(bf)
    wd = (torch.randn(i, h) * 0.02).to(bf)
    out = torch.empty_like(x)
    tiles = kernels.SWIGLU_TILES
    fused_us, fused_wall = _simulated_us(
        kernels.swiglu_mlp_kernel(bk, h, i, bf, tiles), x, wg, wu, wd, out
    )
    gate_up, act, down = kernels.swiglu_split_kernels(bk, h, i, bf, tiles)
    g, u, a = (torch.empty(n, i, dtype=bf) for _ in range(3))
    split = [
        _simulated_us(gate_up, x, wg, wu, g, u),
        _simulated_us(act, g, u, a),
        _simulated_us(down, a, wd, out),
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
        us, wall = _simulated_us(kernels.swiglu_mlp_kernel(bk, h, i, bf, t), x, wg, wu, wd, out)
        rows.append(
            {
                "bench": "swiglu tiles",
                "tiles": name,
                "shape": f"{n}x{h}x{i}",
                "sim_us": us,
                "wall_s": wall,
            }
        )

    xr = torch.randn(1024, h).to(bf)
    w = torch.ones(h, dtype=bf)
    o = torch.empty_like(xr)
    for vr in (1, 4, 8):
        us, wall = _simulated_us(
            kernels.rms_norm_kernel(bk, h, bf, 1e-6, Tiles(rows=8, vec_rows=vr)), xr, w, o
        )
        rows.append(
            {
                "bench": "rms_norm tiles",
                "tiles": f"vec rows {vr}",
                "shape": f"1024x{h}",
                "sim_us": us,
                "wall_s": wall,
            }
        )

    for s in (1, 64):
        q, k = torch.randn(1, 16, s, 128).to(bf), torch.randn(1, 2, s, 128).to(bf)
        cos, sin = torch.rand(3, 1, s, 128).to(bf), torch.rand(3, 1, s, 128).to(bf)
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        us, wall = _simulated_us(
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

    shutil.rmtree(OUT, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
