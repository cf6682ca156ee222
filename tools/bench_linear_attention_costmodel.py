"""PyPTO cost model: the fused linear-attention decode step vs the unfused operator chain.

A relative signal at fixed shapes (simulated "Total Cycles" / 1800 = us on a 910B-class
core array), not an NPU time. Decode, one token per sequence (``--batch``, default 1),
bf16 (``--dtype``), one layer, at the published layer shapes:

* qwen3_5_9b: Qwen3.5-9B Gated DeltaNet, 16 key heads, 32 value heads, head dims 128
  (hidden 4096);
* qwen3_6_27b: Qwen3.6-27B Gated DeltaNet, 16 key heads, 48 value heads, head dims 128
  (hidden 5120);
* kimi_linear_48b_a3b: Kimi-Linear-48B-A3B KDA, 32 heads, head dim 128 (hidden 2304).

* fused: one launch of ``gated_delta_step_kernel`` / ``kda_step_kernel`` (the state read
  and written once), at the best of its state-tile search (``vec_rows`` in 16/32/64/128
  x ``vec_cols`` in 64/128, clipped to the head and filtered by ``ub_fits``).
* unfused chain: what eager transformers launches for the step, one launch per torch
  operator (small pointwise groups share one stage, which favours the chain;
  ``pypto_kernels_linear_attention.costmodel`` says which), each stage simulated on its
  own and the times summed. Every stage takes its own best tiles: the state stages over
  the fused step's candidates, the per-head row stages over 1, 8 or all heads per task.

``--no-search`` runs the package defaults (``kernels.step_tiles(op)`` for the fused
steps, ``STEP_TILES`` for the chain's stages). The search
and each stage's time are printed. The bytes-moved floor: the fused step must read and
write the fp32 state once (2 x B x Hv x Dk x Dv x 4 bytes) plus its small inputs and
output; the floor is those bytes at 48 vector cores x 32 B/cycle (PyPTO 0.2.0's
``lib/configs/A2A3.ini``: ``vector_core_cnt``, ``ddr_rate``), reads and writes not
overlapped.

    python tools/bench_linear_attention_costmodel.py [--json] [--no-search] [--batch 1]
        [--dtype bf16] [--models qwen3_5_9b,qwen3_6_27b,kimi_linear_48b_a3b]
        [--shape heads=2,dim=16,k_heads=2,v_heads=4,dk=16,dv=16]

``--shape`` overrides layer sizes (a reduced run, marked as such); each key applies to
the models whose layer has it. Exit codes: 0 printed, 1 every tiling of a kernel failed,
2 bad arguments, 3 PyPTO's cost model cannot run here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from pypto_kernels_common import CostModelError, Tiles
from pypto_kernels_common import sim as pypto_sim
from pypto_kernels_common.costmodel import CYCLES_PER_US, ub_fits
from pypto_kernels_linear_attention.costmodel import (
    STAGE_OPS,
    LinearAttentionSimulator,
    chain,
    check_shape,
    io_bytes,
    row_group,
    stage_tiling,
    state_bytes,
)
from pypto_kernels_linear_attention.kernels import STEP_TILES, state_tiles, step_tiles
from pypto_kernels_linear_attention.package import INSTALL_HINT

TOOL = "bench_linear_attention_costmodel"

MODELS: dict[str, dict[str, Any]] = {
    "qwen3_5_9b": {
        "label": "Qwen3.5-9B Gated DeltaNet",
        "kernel": "gated_delta_step",
        "shape": {"k_heads": 16, "v_heads": 32, "dk": 128, "dv": 128},
        "hidden": 4096,
    },
    "qwen3_6_27b": {
        "label": "Qwen3.6-27B Gated DeltaNet",
        "kernel": "gated_delta_step",
        "shape": {"k_heads": 16, "v_heads": 48, "dk": 128, "dv": 128},
        "hidden": 5120,
    },
    "kimi_linear_48b_a3b": {
        "label": "Kimi-Linear-48B-A3B KDA",
        "kernel": "kda_step",
        "shape": {"heads": 32, "dim": 128},
        "hidden": 2304,
    },
}
LAYER_KEYS = {"gated_delta_step": ("k_heads", "v_heads", "dk", "dv"), "kda_step": ("heads", "dim")}

#: The fused step's state-tile candidates (and the state stages').
VEC_ROWS = (16, 32, 64, 128)
VEC_COLS = (64, 128)
#: Heads per task of the chain's per-head row stages; 0 = every head of a batch row.
ROW_GROUPS = (1, 8, 0)
#: PyPTO 0.2.0 lib/configs/A2A3.ini: vector_core_cnt and ddr_rate (bytes per cycle).
VECTOR_CORES = 48
DDR_BYTES_PER_CYCLE = 32
TARGET = 2.0


class AllFailed(Exception):
    """Every tiling of one kernel failed (the message is one line)."""


def _heads(shape: dict[str, int]) -> int:
    """Value heads of either layer's shape (the chain's row stages loop over them)."""
    return shape["heads"] if "heads" in shape else shape["v_heads"]


def _head_dims(shape: dict[str, int]) -> tuple[int, int]:
    """(Dk, Dv) of either layer's shape."""
    if "dim" in shape:
        return shape["dim"], shape["dim"]
    return shape["dk"], shape["dv"]


def state_candidates(search: bool, shape: dict[str, int], kernel: str | None = None) -> list[Tiles]:
    """The state tiles to try, clipped to the head; one per distinct clipped tile. Without
    the search: the fused ``kernel``'s package default, or STEP_TILES for a chain stage."""
    if not search:
        return [step_tiles(kernel) if kernel else STEP_TILES]
    dk, dv = _head_dims(shape)
    out: list[Tiles] = []
    seen: set[tuple[int, int]] = set()
    for r in VEC_ROWS:
        for c in VEC_COLS:
            t = dataclasses.replace(STEP_TILES, vec_rows=r, vec_cols=c)
            clipped = state_tiles(dk, dv, t)
            if ub_fits(*clipped) and clipped not in seen:
                seen.add(clipped)
                out.append(t)
    return out


def row_candidates(search: bool, shape: dict[str, int]) -> list[Tiles]:
    """Heads per task for the per-head row stages; one per distinct group that fits UB."""
    if not search:
        return [STEP_TILES]
    heads, width = _heads(shape), max(_head_dims(shape))
    out: list[Tiles] = []
    seen: set[int] = set()
    for g in ROW_GROUPS:
        t = dataclasses.replace(STEP_TILES, rows=g or heads)
        group = row_group(heads, t)
        if group not in seen and ub_fits(group, width):
            seen.add(group)
            out.append(t)
    return out or [STEP_TILES]


def _tiles_label(kernel: str, t: Tiles, shape: dict[str, int]) -> str:
    how = stage_tiling(kernel)
    if how == "state":
        r, c = state_tiles(*_head_dims(shape), t)
        return f"{r}x{c}"
    if how == "rows":
        g = row_group(_heads(shape), t)
        return f"{g} head{'s' if g > 1 else ''}/task"
    return "-"


def best(
    sim: LinearAttentionSimulator,
    kernel: str,
    shape: dict[str, int],
    dtype: str,
    tiles: list[Tiles],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The fastest tiling of ``kernel`` and every one tried (progress on stderr)."""
    tried = []
    for t in tiles:
        r = sim.simulate(kernel, shape, dtype, t).to_dict()
        r["label"] = _tiles_label(kernel, t, shape)
        tried.append(r)
        print(
            f"  {kernel:28s} {r['label']:14s} "
            + (f"{r['sim_us']:9.1f} us" if r["ok"] else f"failed: {r['error']}"),
            file=sys.stderr,
        )
    ok = [r for r in tried if r["ok"]]
    if not ok:
        raise AllFailed(f"every tiling of {kernel} failed: {tried[0]['error']}")
    return min(ok, key=lambda r: r["sim_us"]), tried


def run_model(
    sim: LinearAttentionSimulator,
    name: str,
    shape: dict[str, int],
    dtype: str,
    search: bool,
    reduced: bool,
) -> dict[str, Any]:
    m = MODELS[name]
    kernel = m["kernel"]
    print(f"{name}: {kernel} {shape} {dtype}", file=sys.stderr)
    fused, fused_tried = best(sim, kernel, shape, dtype, state_candidates(search, shape, kernel))
    stages = []
    for stage in chain(kernel, shape, dtype):
        how = stage_tiling(stage)
        cands = (
            state_candidates(search, shape)
            if how == "state"
            else row_candidates(search, shape)
            if how == "rows"
            else [STEP_TILES]
        )
        b, tried = best(sim, stage, shape, dtype, cands)
        what, ops = STAGE_OPS[stage]
        stages.append(
            {
                "stage": stage,
                "torch_ops": ops,
                "what": what,
                "sim_us": b["sim_us"],
                "tiles": b["label"],
                "tried": [(r["label"], r["sim_us"]) for r in tried],
            }
        )
    chain_us = sum(s["sim_us"] for s in stages)
    state_rw = 2 * state_bytes(shape)
    other = io_bytes(kernel, shape, dtype)
    floor_us = (state_rw + other) / (VECTOR_CORES * DDR_BYTES_PER_CYCLE) / CYCLES_PER_US
    return {
        "model": name,
        "label": m["label"],
        "kernel": kernel,
        "shape": dict(shape),
        "reduced": reduced,
        "hidden": m["hidden"],
        "dtype": dtype,
        "fused_us": fused["sim_us"],
        "fused_tiles": fused["label"],
        "fused_search": [
            {"tiles": r["label"], "sim_us": r["sim_us"], "error": r["error"]} for r in fused_tried
        ],
        "chain_us": chain_us,
        "launches": len(stages),
        "torch_ops": sum(s["torch_ops"] for s in stages),
        "stages": stages,
        "chain_over_fused": chain_us / fused["sim_us"],
        "target_met": chain_us / fused["sim_us"] >= TARGET,
        "state_bytes_rw": state_rw,
        "io_bytes": other,
        "floor_us": floor_us,
        "fused_over_floor": fused["sim_us"] / floor_us,
    }


def parse_shape(text: str, names: list[str]) -> dict[str, int]:
    """``k=v,k=v`` sizes; a CostModelError (one line) for a key no selected layer has."""
    known = {k for n in names for k in LAYER_KEYS[MODELS[n]["kernel"]]}
    out: dict[str, int] = {}
    for part in filter(None, text.split(",")):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in known:
            raise CostModelError(
                f"--shape: {part!r} is not KEY=INT with KEY one of {', '.join(sorted(known))}"
            )
        try:
            out[key] = int(value)
        except ValueError:
            raise CostModelError(f"--shape: {key} must be an integer, not {value!r}") from None
    return out


def _fmt(us: float | None) -> str:
    return "failed" if us is None else f"{us:.1f}"


def print_tables(rows: list[dict[str, Any]], batch: int, dtype: str) -> None:
    def layer(r: dict[str, Any]) -> str:
        s = r["shape"]
        dims = (
            f"H {s['heads']}, D {s['dim']}"
            if "dim" in s
            else f"Hk {s['k_heads']}, Hv {s['v_heads']}, Dk {s['dk']}, Dv {s['dv']}"
        )
        return dims + (" (reduced)" if r["reduced"] else "")

    print(
        f"| model (layer) | shape (decode, batch {batch}) | fused step (1 launch) "
        "| unfused chain | chain / fused | >= 2x |"
    )
    print("|---|---|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['label']} | {layer(r)} | {r['fused_us']:.1f} us ({r['fused_tiles']}) "
            f"| {r['chain_us']:.1f} us ({r['launches']} launches for {r['torch_ops']} torch ops) "
            f"| {r['chain_over_fused']:.2f}x | {'yes' if r['target_met'] else 'no'} |"
        )
    print(
        f"\n| model | state read + write | other inputs / output | floor at {VECTOR_CORES} x "
        f"{DDR_BYTES_PER_CYCLE} B/cycle | fused / floor | chain / floor |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['label']} | {r['state_bytes_rw'] / 2**20:.2f} MiB | {r['io_bytes'] / 2**10:.1f} KiB "
            f"| {r['floor_us']:.3g} us | {r['fused_over_floor']:.0f}x "
            f"| {r['chain_us'] / r['floor_us']:.0f}x |"
        )
    print("\nFused step, state-tile search (simulated us):\n")
    tiles = list(dict.fromkeys(e["tiles"] for r in rows for e in r["fused_search"]))
    print("| state tile | " + " | ".join(r["label"] for r in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for t in tiles:
        cells = []
        for r in rows:
            e = next((e for e in r["fused_search"] if e["tiles"] == t), None)
            best_mark = e is not None and e["tiles"] == r["fused_tiles"]
            cell = "-" if e is None else _fmt(e["sim_us"])
            cells.append(f"**{cell}**" if best_mark else cell)
        print(f"| {t} | " + " | ".join(cells) + " |")
    print("\nUnfused chain, per stage (simulated us at the stage's best tiles):\n")
    order = list(dict.fromkeys(s["stage"].partition(".")[2] for r in rows for s in r["stages"]))
    print("| stage (eager torch ops) | " + " | ".join(r["label"] for r in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for name in order:
        cells, ops = [], set()
        for r in rows:
            s = next((s for s in r["stages"] if s["stage"].partition(".")[2] == name), None)
            if s is None:
                cells.append("-")
            else:
                ops.add(s["torch_ops"])
                tiles = "" if s["tiles"] == "-" else f" ({s['tiles']})"
                cells.append(f"{s['sim_us']:.1f}{tiles}")
        print(f"| {name} ({'/'.join(str(o) for o in sorted(ops))}) | " + " | ".join(cells) + " |")
    print(
        "| **total** | "
        + " | ".join(f"**{r['chain_us']:.1f}** ({r['launches']} launches)" for r in rows)
        + " |"
    )
    print(
        f"\nPyPTO 0.2.0 cost model (SIM), {dtype}; a relative signal at fixed shapes, not an NPU time."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON on stdout")
    ap.add_argument("--no-search", action="store_true", help="package default tiles only")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    ap.add_argument("--batch", type=int, default=1, help="decode batch (default 1)")
    ap.add_argument("--dtype", default="bf16", help="bf16 (default), fp16 or fp32")
    ap.add_argument("--shape", default="", help="layer-size overrides, e.g. heads=2,dim=16")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per simulated call")
    args = ap.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown or not names:
        bad = unknown[0] if unknown else args.models
        print(f"{TOOL}: unknown model {bad!r}; choose from {', '.join(MODELS)}", file=sys.stderr)
        return 2
    try:
        override = parse_shape(args.shape, names)
        shapes = {}
        for n in names:
            m = MODELS[n]
            keys = LAYER_KEYS[m["kernel"]]
            shape = {
                "batch": args.batch,
                **m["shape"],
                **{k: override[k] for k in keys if k in override},
            }
            shapes[n] = check_shape(m["kernel"], shape, args.dtype)
    except CostModelError as err:
        print(f"{TOOL}: {err}", file=sys.stderr)
        return 2
    reason = pypto_sim.availability(install_hint=INSTALL_HINT)
    if reason:
        print(f"{TOOL}: {reason}", file=sys.stderr)
        return 3
    rows = []
    try:
        with LinearAttentionSimulator(timeout_s=args.timeout) as sim:
            for n in names:
                reduced = any(shapes[n][k] != v for k, v in MODELS[n]["shape"].items())
                rows.append(run_model(sim, n, shapes[n], args.dtype, not args.no_search, reduced))
    except AllFailed as err:
        print(f"{TOOL}: {err}", file=sys.stderr)
        return 1
    except pypto_sim.SimUnavailableError as err:
        print(f"{TOOL}: {err}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps({"batch": args.batch, "dtype": args.dtype, "rows": rows}, indent=1))
        return 0
    print_tables(rows, args.batch, args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
