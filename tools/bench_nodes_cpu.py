#!/usr/bin/env python3
"""1 node x 2 ranks vs 2 "nodes" x 1 rank on this CPU: what the multi-node path costs.

Both run the same 2-rank tensor-parallel step of the tiny llama (gloo, one core per rank):
``pypto-bench run --nproc 2`` (one launcher) and two ``pypto-bench run --nnodes 2
--nproc-per-node 1`` commands meeting at a c10d rendezvous on 127.0.0.1 (two launchers,
two temporary folders, as two hosts would run them). The two layouts alternate round by
round; per round the ratio of aggregate tok/s (2 nodes / 1 node) and each layout's share
of the step in collectives. On one machine this measures the mechanics (two agents, two
rendezvous participants, the peer check) and gloo over loopback, not a network.

    python tools/bench_nodes_cpu.py [--rounds 3] [--workdir DIR] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e_cpu import tool_models, write_section

SECTION = "## pypto-bench: 1 node x 2 ranks vs 2 nodes x 1 rank (CPU, loopback)"
BIN = str(Path(sys.executable).parent / "pypto-bench")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _args(model: Path, regime: str, report: Path) -> list[str]:
    extra = ["--gen", "16"] if regime == "decode" else []
    return [BIN, "run", "--model-path", str(model), "--device", "cpu", "--regime", regime,
            "--seq", "64", "--arms", "eager", "--iters", "10", "--warmup", "2",
            "--no-bandwidth", "--no-progress", "-q", "--report", str(report), *extra]  # fmt: skip


def _figures(report: Path) -> dict[str, float]:
    d = json.loads(report.read_text())["distributed"]
    return {
        "tok_s": float(d["aggregate_tokens_per_s"]["median"]),
        "comm": float(d["communication_share"]["median"]),
    }


def one_node(model: Path, regime: str, work: Path) -> dict[str, float]:
    report = work / "one.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([*_args(model, regime, report), "--nproc", "2"], env=env, check=True)
    return _figures(report)


def two_nodes(model: Path, regime: str, work: Path) -> dict[str, float]:
    report = work / "two.json"
    port = _free_port()
    procs = []
    for n in (0, 1):
        tmp = work / f"node{n}"
        tmp.mkdir(exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
        args = [*_args(model, regime, report), "--nnodes", "2", "--node-rank", str(n),
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--nproc-per-node", "1"]  # fmt: skip
        procs.append(subprocess.Popen(args, env=env))
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"a node failed ({p.returncode})")
    return _figures(report)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-nodes-"))
    work.mkdir(parents=True, exist_ok=True)
    ((_, model, _),) = tool_models(work, big=False, gens=(16, 16))
    rows = []
    for regime in ("prefill", "decode"):
        got: dict[str, list[dict[str, float]]] = {"one": [], "two": []}
        for r in range(args.rounds):
            order = ("one", "two") if r % 2 == 0 else ("two", "one")  # ABBA
            for layout in order:
                fn = one_node if layout == "one" else two_nodes
                got[layout].append(fn(model, regime, work))
        ratios = [t["tok_s"] / o["tok_s"] for o, t in zip(got["one"], got["two"], strict=True)]
        row = {
            "regime": regime,
            "one_tok_s": statistics.median(x["tok_s"] for x in got["one"]),
            "two_tok_s": statistics.median(x["tok_s"] for x in got["two"]),
            "one_comm": statistics.median(x["comm"] for x in got["one"]),
            "two_comm": statistics.median(x["comm"] for x in got["two"]),
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    lines = [
        SECTION,
        "",
        f"Command: `python tools/bench_nodes_cpu.py {' '.join(sys.argv[1:])}` on "
        f"{os.cpu_count()} cores (shared); tiny llama (2 x 64), seq 64, eager arm, gloo, one "
        f"thread per rank, 10 timed iterations a run; medians of {args.rounds} rounds, the "
        "two layouts alternating (ABBA); ratio range over rounds in brackets.",
        "",
        "| regime | 1 node x 2 ranks tok/s | 2 nodes x 1 rank tok/s | 2 nodes / 1 node | "
        "time in collectives (1 node / 2 nodes) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['regime']} | {r['one_tok_s']:.1f} | {r['two_tok_s']:.1f} | "
            f"{r['ratio']:.2f} [{r['ratio_min']:.2f}, {r['ratio_max']:.2f}] | "
            f"{r['one_comm']:.0%} / {r['two_comm']:.0%} |"
        )
    lines += [
        "",
        "Mechanics and communication cost on one machine, stated as such: both layouts run "
        "the same two ranks over gloo on loopback, so a ratio near 1 says the multi-node path "
        "(two launchers, c10d rendezvous, the peer check) adds nothing to the timed steps; "
        "a real network adds its latency to every collective. GPU / NPU figures are pending "
        "a device (tools/device_check_distributed.py).",
        "",
    ]
    text = "\n".join(lines)
    print(text, file=sys.stderr)
    if args.write:
        write_section(text, SECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
