#!/usr/bin/env python3
"""Issue #17's multi-device figures in one deadline-bounded run (``--nproc``).

Every run goes through ``python -m pypto_bench run`` so the figures are the bench's own
protocol (rank 0 runs the 1-rank baseline in the same invocation: speedup, scaling
efficiency, per-rank step min/median/max, communication share, memory per rank):

* N = the visible GPUs (NCCL), cut to the largest N that divides the model's KV heads
  (tensor parallelism splits heads evenly; the summary says when N was cut). With one GPU
  the 1-rank path runs (``--nproc 1``): the same figures without the sharded run.
* 0.5B-class (Qwen2.5-0.5B shape, 14/2 heads: N <= 2), bf16 random weights: prefill at
  seq 512, then decode eager and graph (each rank's step captured in a CUDA graph with its
  NCCL collectives inside; greedy tokens compared with the 1-rank run); with 2+ GPUs also
  ``--placement pipeline`` prefill over every visible GPU (layers split by stages).
* 7B-class (Qwen2.5-7B shape, 28/4 heads: N <= 4), unless ``--skip-7b``: prefill seq 512.
* Past one machine (issue #30): with 2+ usable GPUs, the 0.5B prefill as two "nodes" on this
  host (two ``pypto-bench run --nnodes 2`` processes, each its half of the GPUs, c10d
  rendezvous on 127.0.0.1; NCCL between them), and ``pypto-tune profile --nproc N``: one
  profile per rank under ``ranks_05b/`` and its per-rank summary (slowest rank, straggler,
  time in collectives). One GPU: both skipped, said so (two ranks cannot share a GPU
  under NCCL).

Every step gets what is left of ``--budget-s`` (a step with under 20 s left is skipped and
said so); the ranks' own watchdog (``--rank-timeout``) ends a hung rank. Reports, logs and
summary.md land in ``--out`` (``$OUT``). ``--dry-run``: the same steps on CPU (gloo, 2
ranks, a tiny Llama, seq 8, plus the decode graph arm, the two nodes and the per-rank
profile): plumbing only, no GPU needed.

    python tools/device_check_distributed.py [--out DIR] [--budget-s 540] [--dry-run] [--skip-7b]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_check_decode import QWEN7B_SHAPE, ROOT, Steps, _build, _env, _f


def _gpus() -> int:
    import subprocess

    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60
        )
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return 0


def ranks_for(gpus: int, kv_heads: int, heads: int) -> int:
    """The largest rank count <= ``gpus`` that divides both head counts (>= 1)."""
    return max(n for n in range(1, max(gpus, 1) + 1) if kv_heads % n == 0 and heads % n == 0)


def _run(
    model: Path,
    report: Path,
    *,
    device: str,
    dtype: str,
    nproc: int,
    regime: str,
    seq: int,
    gen: int,
    iters: int,
    arms: str,
    rank_timeout: float,
    placement: str = "tensor",
) -> list[str]:
    return [
        sys.executable, "-m", "pypto_bench", "run", "--model-path", str(model),
        "--device", device, "--dtype", dtype, "--regime", regime, "--seq", str(seq),
        "--gen", str(gen), "--warmup", "1", "--iters", str(iters), "--ignore-eos",
        "--arms", arms, "--nproc", str(nproc), "--rank-timeout", str(rank_timeout),
        "--placement", placement, "--no-progress", "--report-file", str(report),
    ]  # fmt: skip


def two_nodes(steps: Steps, name: str, argv: list[str], gpus: int, limit: float) -> int | None:
    """``argv`` (a ``pypto-bench run`` without node flags) as two nodes on this host, each
    node's process group ended when the step ends however it ends; node n sees its half
    of the GPUs (``gpus`` 0: the CPU)."""
    left = steps.deadline - time.monotonic()
    if left < 20:
        steps.say(f"== {name}: SKIPPED ({left:.0f} s left before the deadline)")
        return None
    limit = min(limit, left)
    steps.say(f"== {name} (two nodes on 127.0.0.1, limit {limit:.0f} s)")
    from pypto_bench.multi.launch import free_port

    port, half = free_port(), max(1, gpus // 2)
    procs, logs = [], []
    start = time.monotonic()
    try:
        for n in (0, 1):
            env = _env()
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(n * half + i) for i in range(half))
            logs.append((steps.out / f"{name}.node{n}.log").open("w"))
            node = ["--nnodes", "2", "--node-rank", str(n), "--rdzv-endpoint",
                    f"127.0.0.1:{port}", "--nproc-per-node", str(half)]  # fmt: skip
            procs.append(
                subprocess.Popen(
                    argv + node, stdout=logs[-1], stderr=subprocess.STDOUT, env=env,
                    start_new_session=True,
                )
            )  # fmt: skip
        deadline = start + limit
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.5)
        codes = [124 if p.poll() is None else p.returncode for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for fh in logs:
            fh.close()
    rc = max(codes, key=abs)
    steps.say(f"== {name}: rc={rc} (nodes: {codes}) in {time.monotonic() - start:.0f} s")
    for n in (0, 1):
        tail = (steps.out / f"{name}.node{n}.log").read_text(errors="replace").splitlines()[-6:]
        steps.lines.extend(f"    node{n}: {t}" for t in tail)
    return rc


def summarise_ranks(out: Path) -> list[str]:
    """The per-rank profile's summary (``pypto-tune profile --nproc``), where it ran."""
    path = out / "ranks_05b" / "ranks.md"
    if not path.is_file():
        return []
    return ["", "Per-rank profile (pypto-tune profile --nproc):", "", path.read_text()]


def summarise(out: Path) -> list[str]:
    """One line per arm of every report: ranks, tok/s, scaling, communication, agreement."""
    lines = [
        "",
        "| report | arm | ranks | backend | tok/s best | 1-rank tok/s | efficiency | "
        "step ms med | comm share med | max rank MiB | agreement |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for path in sorted(out.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        dist = data.get("distributed")
        for arm in data.get("arms", []):
            tps = (arm.get("tokens_per_s") or {}).get("best")
            if dist:
                per = (dist.get("arms") or {}).get(arm["name"]) or dist
                ranks = dist.get("ranks") or []
                mem = [
                    ((r.get("memory") or {}).get("peak_allocated")
                     or (r.get("memory") or {}).get("rss_peak_bytes") or 0)
                    for r in ranks
                ]  # fmt: skip
                lines.append(
                    f"| {path.stem} | {arm['name']} | {dist['nproc']} | "
                    f"{dist.get('backend') or dist.get('placement')} | "
                    f"{_f(tps, '.1f')} | "
                    f"{_f((per.get('baseline') or {}).get('tokens_per_s', {}).get('best'), '.1f')}"
                    f" | {_f(per.get('scaling_efficiency'), '.2f')} | "
                    f"{_f((per.get('step_s') or {}).get('median') and per['step_s']['median'] * 1e3, '.1f')} | "
                    f"{_f((per.get('communication_share') or {}).get('median'), '.2f')} | "
                    f"{_f(max(mem) / 2**20 if mem else None, '.0f')} | "
                    f"{(per.get('agreement') or {}).get('summary', '-')} |"
                )
            else:
                lines.append(
                    f"| {path.stem} | {arm['name']} | 1 | - | {_f(tps, '.1f')} | - | - | "
                    f"{_f((arm.get('seconds') or {}).get('median') and arm['seconds']['median'] * 1e3, '.1f')}"
                    " | - | - | - |"
                )
        if data.get("noise", {}) and data["noise"].get("noisy"):
            lines.append(f"| {path.stem} | noise: {'; '.join(data['noise']['held'])} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "device-out"))
    ap.add_argument("--budget-s", type=float, default=float(os.environ.get("BUDGET_S", 540)))
    ap.add_argument("--dry-run", action="store_true", help="CPU, gloo, 2 ranks, tiny model")
    ap.add_argument("--skip-7b", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Model folders stay outside --out: $OUT comes back from the device machine.
    work = Path(os.environ.get("WORK") or tempfile.mkdtemp(prefix="pypto-dist-check-"))
    steps = Steps(out, args.budget_s)
    if args.dry_run:
        device, dtype, seq, gen, iters = "cpu", "float32", 8, 4, 1
        small: dict = {}
        small_heads = (4, 2)  # the tiny Llama's attention / KV heads
        gpus = 2
        arch, decode_arms = "llama", "eager,graph"
    else:
        from bench_e2e_cpu import QWEN05_SHAPE

        device, dtype, seq, gen, iters = "cuda", "bfloat16", 512, 32, 3
        small = QWEN05_SHAPE
        small_heads = (int(small["num_attention_heads"]), int(small["num_key_value_heads"]))
        gpus = _gpus()
        arch, decode_arms = "qwen2", "eager,graph"
    steps.say(f"== visible GPUs: {gpus}" if not args.dry_run else "== dry run: CPU, gloo")
    n_small = ranks_for(gpus, small_heads[1], small_heads[0])
    if n_small < gpus:
        steps.say(
            f"== 0.5B-class: {n_small} ranks, not {gpus}: its {small_heads[0]}/{small_heads[1]}"
            " heads must divide evenly"
        )
    if n_small == 1:
        device = device if args.dry_run else "cuda:0"
    rank_timeout = 300.0
    steps.run("build_05b", _build(work, "m05b", arch, dtype, small), 180)
    m05 = work / "m05b"
    kw = {"device": device, "dtype": dtype, "nproc": n_small, "rank_timeout": rank_timeout}
    steps.run(
        "prefill_05b",
        _run(m05, out / "prefill_05b.json", regime="prefill", seq=seq, gen=gen, iters=iters,
             arms="eager", **kw),
        300,
    )  # fmt: skip
    steps.run(
        "decode_05b",
        _run(m05, out / "decode_05b.json", regime="decode", seq=min(seq, 64), gen=gen,
             iters=iters, arms=decode_arms, **kw),
        240,
    )  # fmt: skip
    if gpus >= 2:
        steps.run(
            "pipeline_05b",
            _run(m05, out / "pipeline_05b.json", regime="prefill", seq=seq, gen=gen,
                 iters=iters, arms="eager", placement="pipeline",
                 **{**kw, "nproc": gpus, "device": "cpu" if args.dry_run else "cuda"}),
            240,
        )  # fmt: skip
    if gpus >= 2:  # past one machine: two nodes on this host, then a profile per rank
        nodes_argv = _run(m05, out / "nodes_05b.json", regime="prefill", seq=seq, gen=gen,
                          iters=iters, arms="eager", **{**kw, "nproc": 1})  # fmt: skip
        cut = nodes_argv.index("--nproc")
        del nodes_argv[cut : cut + 2]  # each node's ranks: --nproc-per-node
        two_nodes(steps, "nodes_05b", nodes_argv, 0 if args.dry_run else gpus, 300)
        if n_small >= 2:
            steps.run(
                "ranks_05b",
                [sys.executable, "-m", "pypto_tune", "profile", "--model-path", str(m05),
                 "--device", device, "--dtype", dtype, "--regime", "prefill", "--seq",
                 str(seq), "--iters", str(iters), "--nproc", str(n_small), "--out", str(out / "ranks_05b")],
                240,
            )  # fmt: skip
    else:
        steps.say(
            "== nodes_05b, ranks_05b: SKIPPED (one GPU: two ranks cannot share it under NCCL)"
        )
    if not args.skip_7b and not args.dry_run:
        heads = (int(QWEN7B_SHAPE["num_attention_heads"]), int(QWEN7B_SHAPE["num_key_value_heads"]))
        n_big = ranks_for(gpus, heads[1], heads[0])
        steps.run("build_7b", _build(work, "m7b", "qwen2", dtype, QWEN7B_SHAPE), 300)
        steps.run(
            "prefill_7b",
            _run(work / "m7b", out / "prefill_7b.json", device=device if n_big > 1 else "cuda:0",
                 dtype=dtype, nproc=n_big, regime="prefill", seq=seq, gen=gen, iters=iters,
                 arms="eager", rank_timeout=rank_timeout),
            300,
        )  # fmt: skip
    lines = summarise(out) + summarise_ranks(out)
    print("\n".join(lines), flush=True)
    (out / "summary.md").write_text("\n".join(steps.lines + lines) + "\n")
    failed = [ln for ln in steps.lines if ln.startswith("== ") and "rc=" in ln and "rc=0" not in ln]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
