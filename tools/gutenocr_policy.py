"""GutenOCR's batch policy from data: measure the cost model per op and batch, derive the policy.

Two steps, so the shipped policy is reproducible from the shipped data:

    python tools/gutenocr_policy.py measure [--batches 1,2,4,8,16,32,64] [--layers 36]
    python tools/gutenocr_policy.py derive [--check] [--table]

``measure`` runs PyPTO's cost model (SIM, 910B-class core array; "Total Cycles" / 1800 =
us, a relative signal at fixed shapes) at GutenOCR-3B's decode shapes (hidden 2048,
intermediate 11008, 16 query / 2 key heads, head_dim 128, mrope_section [16, 24, 24]), per
op and batch: the fused kernel against the same work unfused (SwiGLU: 3 kernels;
RMSNorm: 2 kernels, a lower bound of eager's 7 ops; MRoPE: q and k rotated by separate
launches), plus the torch reference's wall time on this CPU (the fallback's cost; not
comparable with simulated NPU time). It writes
``pypto_kernels_gutenocr/costmodel_data.json``. ``derive`` turns that data into
``pypto_kernels_gutenocr/batch_policy.json`` (``pypto_kernels_gutenocr.policy.derive_policy``)
and prints the docs table; ``--check`` exits 1 when the committed policy differs from what
the committed data derives.

Exit status: 0 ok; 1 --check found a difference; 2 usage; 3 PyPTO cannot run here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "packages" / "pypto-kernels-gutenocr" / "src" / "pypto_kernels_gutenocr"
DATA = PKG / "costmodel_data.json"
POLICY = PKG / "batch_policy.json"
BATCHES = (1, 2, 4, 8, 16, 32, 64)
SHAPE = {"hidden": 2048, "inter": 11008, "q_heads": 16, "k_heads": 2, "head_dim": 128}
SECTIONS = (16, 24, 24)
MEASURE_CMD = "python tools/gutenocr_policy.py measure"


def _sim_us(fn: Any, *args: Any) -> float:
    from pypto_kernels_gutenocr import costmodel as cm

    cycles, _wall = cm.measure(fn, *args)
    if cycles is None:
        raise RuntimeError("the cost model wrote no Total Cycles for a kernel call")
    return cycles / cm.CYCLES_PER_US


def _cpu_ms(fn: Any, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def measure_op(op: str, batch: int, bk: Any) -> dict[str, Any]:
    """One op at one decode batch: fused and unfused simulated us, CPU reference ms."""
    import torch

    from pypto_kernels_gutenocr import kernels, reference

    bf = torch.bfloat16
    h, i, d = SHAPE["hidden"], SHAPE["inter"], SHAPE["head_dim"]
    if op == "rms_norm":
        x, w = torch.zeros(batch, h, dtype=bf), torch.ones(h, dtype=bf)
        out = torch.empty_like(x)
        tiles = kernels.rms_tiles(bf)
        fused = _sim_us(kernels.rms_norm_kernel(bk, h, bf, 1e-6, tiles), x, w, out)
        stats, apply = kernels.rms_norm_split_kernels(bk, h, bf, 1e-6, tiles)
        rstd = torch.empty(batch, 1, dtype=torch.float32)
        parts = [_sim_us(stats, x, rstd), _sim_us(apply, x, rstd, w, out)]
        xr = torch.randn(batch, h).to(bf)
        cpu = _cpu_ms(lambda: reference.rms_norm_reference(xr, w, 1e-6))
        shape = f"x [{batch}, {h}]"
    elif op == "mrope":
        hq, hk = SHAPE["q_heads"], SHAPE["k_heads"]
        q, k = torch.zeros(batch, hq, 1, d, dtype=bf), torch.zeros(batch, hk, 1, d, dtype=bf)
        cos = sin = torch.zeros(3, batch, 1, d, dtype=bf)
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        fused = _sim_us(
            kernels.mrope_kernel(bk, batch, hq, hk, 1, d, SECTIONS, bf), q, k, cos, sin, qo, ko
        )
        parts = [
            _sim_us(kernels.rope_one_kernel(bk, batch, hq, 1, d, SECTIONS, bf), q, cos, sin, qo),
            _sim_us(kernels.rope_one_kernel(bk, batch, hk, 1, d, SECTIONS, bf), k, cos, sin, ko),
        ]
        qr, kr = (
            torch.randn_like(q, dtype=torch.float32).to(bf),
            torch.randn_like(k, dtype=torch.float32).to(bf),
        )
        cr = torch.randn(3, batch, 1, d).to(bf)
        cpu = _cpu_ms(lambda: reference.mrope_reference(qr, kr, cr, cr, SECTIONS))
        shape = f"q [{batch}, {hq}, 1, {d}], k [{batch}, {hk}, 1, {d}]"
    elif op == "swiglu_mlp":
        x = torch.zeros(batch, h, dtype=bf)
        wg = torch.zeros(h, i, dtype=bf)
        wd = torch.zeros(i, h, dtype=bf)
        out = torch.empty_like(x)
        tiles = kernels.swiglu_tiles(bf)
        fused = _sim_us(kernels.swiglu_mlp_kernel(bk, h, i, bf, tiles), x, wg, wg, wd, out)
        gate_up, act, down = kernels.swiglu_split_kernels(bk, h, i, bf, tiles)
        g, u, a = (torch.zeros(batch, i, dtype=bf) for _ in range(3))
        parts = [
            _sim_us(gate_up, x, wg, wg, g, u),
            _sim_us(act, g, u, a),
            _sim_us(down, a, wd, out),
        ]
        xr = torch.randn(batch, h).to(bf)
        wr = torch.randn(h, i).to(bf) * 0.02
        wdr = torch.randn(i, h).to(bf) * 0.02
        cpu = _cpu_ms(lambda: reference.swiglu_mlp_reference(xr, wr, wr, wdr), repeats=3)
        shape = f"x [{batch}, {h}], W {h}x{i} / {i}x{h}"
    else:
        raise ValueError(op)
    return {
        "op": op,
        "batch": batch,
        "shape": shape,
        "reduced": False,
        "fused_us": round(fused, 3),
        "unfused_us": round(sum(parts), 3),
        "unfused_parts_us": [round(p, 3) for p in parts],
        "cpu_reference_ms": round(cpu, 4),
    }


def cmd_measure(args: argparse.Namespace) -> int:
    from pypto_kernels_common import sim

    sim.prepare_environment()
    import torch

    from pypto_kernels_gutenocr import costmodel as cm

    reason = cm.availability()
    if reason:
        print(f"gutenocr_policy: {reason}", file=sys.stderr)
        return 3
    torch.set_num_threads(1)
    bk = cm.cost_backend()
    rows = []
    for op in args.ops:
        for b in args.batches:
            t = time.perf_counter()
            row = measure_op(op, b, bk)
            rows.append(row)
            print(
                f"{op} b{b}: fused {row['fused_us']} us, unfused {row['unfused_us']} us "
                f"({time.perf_counter() - t:.0f} s)",
                file=sys.stderr,
            )
    import importlib.metadata as md

    from pypto_kernels_gutenocr.policy import CALLS_PER_STEP

    doc = {
        "schema_version": 1,
        "command": MEASURE_CMD,
        "what": "PyPTO cost model (SIM, 910B-class), decode (seq 1) at GutenOCR-3B shapes; "
        "us = Total Cycles / 1800; cpu_reference_ms = torch reference wall time on the "
        "machine that measured (median), the fallback's cost",
        "shape": {**SHAPE, "mrope_section": list(SECTIONS), "layers": args.layers},
        "calls_per_decode_step": CALLS_PER_STEP,
        "versions": {d: md.version(d) for d in ("pypto", "torch")},
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def cmd_derive(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(PKG.parent))
    from pypto_kernels_gutenocr.policy import derive_policy, policy_table, render_policy

    try:
        data = json.loads(Path(args.data).read_text())
        text = render_policy(derive_policy(data))
    except (OSError, ValueError, KeyError) as err:
        print(f"gutenocr_policy: {args.data}: {err} (rerun `{MEASURE_CMD}`)", file=sys.stderr)
        return 2
    if args.table:
        print(policy_table(data))
    if args.check:
        current = Path(args.out).read_text() if Path(args.out).exists() else ""
        if current != text:
            print(
                f"gutenocr_policy: {args.out} differs from what {args.data} derives; "
                "run `python tools/gutenocr_policy.py derive`",
                file=sys.stderr,
            )
            return 1
        print(f"{args.out} matches {args.data}", file=sys.stderr)
        return 0
    Path(args.out).write_text(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write batches like 1,2,4") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: batches must be >= 1")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="run the cost model, write the data file")
    m.add_argument("--batches", type=_ints, default=BATCHES)
    m.add_argument(
        "--ops", type=lambda s: s.split(","), default=["rms_norm", "mrope", "swiglu_mlp"]
    )
    m.add_argument("--layers", type=int, default=36, help="decoder layers (GutenOCR-3B: 36)")
    m.add_argument("--out", default=str(DATA))
    d = sub.add_parser("derive", help="derive the policy file from the data file")
    d.add_argument("--data", default=str(DATA))
    d.add_argument("--out", default=str(POLICY))
    d.add_argument("--check", action="store_true", help="compare instead of writing")
    d.add_argument("--table", action="store_true", help="print the docs table (markdown)")
    args = ap.parse_args(argv)
    return cmd_measure(args) if args.cmd == "measure" else cmd_derive(args)


if __name__ == "__main__":
    sys.exit(main())
