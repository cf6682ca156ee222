#!/usr/bin/env python3
"""Issue #16's CUDA figures in one deadline-bounded run on a lent GPU.

Decode, bf16, random weights (throughput does not depend on the values), every run through
``python -m pypto_bench run`` so the figures are the bench's own protocol:

* 0.5B-class (Qwen2.5-0.5B shape) batch 1: eager, graph with the default backend (auto ->
  fused: inductor-compiled step captured in a CUDA graph) and hf-compile (transformers'
  static cache + torch.compile, its CUDA default reduce-overhead); then the graph arm with
  ``--graph-backend cudagraph`` (the eager step captured, the 9.5%-of-roofline path) for
  the before/after. Targets: graph >= 25% of the bandwidth roofline, >= 1.2x hf-compile.
* 0.5B-class batch sweep 1,8,32 (roofline against bandwidth and matmul peak per batch).
* 0.5B-class Qwen3.5-shaped hybrid (Gated DeltaNet + gated attention, issue #26) batch 1:
  eager, graph, hf-compile; the roofline counts the recurrent state read and written.
* 7B-class (Qwen2.5-7B shape) batch 1: eager, graph, hf-compile. Target: graph >= 70% of
  the roofline.
Token match 100% expected in every case (bf16 may flip near-ties: the reports say where).

Every step gets what is left of ``--budget-s``; a step that would start with under 20 s
left is skipped and said so. Reports, logs and summary.md land in ``--out`` (``$OUT``).
``--dry-run`` runs the same steps on CPU with tiny models and tiny lengths (a syntax and
plumbing check that needs no GPU).

    python tools/device_check_decode.py [--out DIR] [--budget-s 540] [--dry-run] [--skip-7b]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = [
    "pypto-common",
    "pypto-capture",
    "pypto-patch",
    "pypto-precision",
    "pypto-bench",
    "pypto-testing",
    "pypto-env",
    "pypto-models-gemma4",
    "pypto-models-minimax",
]

#: Qwen2.5-7B's shape (28 x 3584, GQA 28/4, intermediate 18944, vocab 152064, untied).
QWEN7B_SHAPE = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
}


def _env() -> dict[str, str]:
    paths = [str(ROOT / "packages" / p / "src") for p in SRC] + [str(ROOT / "tools")]
    old = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths + ([old] if old else [])),
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }


class Steps:
    """Runs commands against one deadline and keeps a summary of what ran."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out = out
        self.deadline = time.monotonic() + budget_s
        self.lines: list[str] = []

    def run(self, name: str, argv: list[str], limit: float) -> int | None:
        left = self.deadline - time.monotonic()
        if left < 20:
            self.say(f"== {name}: SKIPPED ({left:.0f} s left before the deadline)")
            return None
        limit = min(limit, left)
        self.say(f"== {name} (limit {limit:.0f} s)")
        log = self.out / f"{name}.log"
        start = time.monotonic()
        with log.open("w") as fh:
            try:
                rc = subprocess.run(
                    argv, stdout=fh, stderr=subprocess.STDOUT, env=_env(), timeout=limit
                ).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        self.say(f"== {name}: rc={rc} in {time.monotonic() - start:.0f} s")
        tail = log.read_text(errors="replace").splitlines()[-12:]
        self.lines.extend("    " + t for t in tail)
        print("\n".join("    " + t for t in tail), flush=True)
        return rc

    def say(self, text: str) -> None:
        self.lines.append(text)
        print(text, flush=True)


def _build(work: Path, name: str, arch: str, dtype: str, shape: dict) -> list[str]:
    code = (
        "import sys, json; from pypto_testing.models import make_tiny_model; "
        "make_tiny_model(sys.argv[1], sys.argv[2], dtype=sys.argv[3], **json.loads(sys.argv[4]))"
    )
    return [sys.executable, "-c", code, str(work / name), arch, dtype, json.dumps(shape)]


def _build_arch(work: Path, name: str, model_type: str, dtype: str, shape: dict) -> list[str]:
    code = (
        "import sys, json; from pypto_testing.architectures import make_tiny_architecture; "
        "make_tiny_architecture(sys.argv[1], sys.argv[2], dtype=sys.argv[3], "
        "**json.loads(sys.argv[4]))"
    )
    return [sys.executable, "-c", code, str(work / name), model_type, dtype, json.dumps(shape)]


def _bench(model: Path, report: Path, device: str, dtype: str, gen: int, iters: int, *extra: str):
    return [
        sys.executable, "-m", "pypto_bench", "run", "--model-path", str(model),
        "--device", device, "--dtype", dtype, "--regime", "decode", "--seq", "16",
        "--gen", str(gen), "--warmup", "1", "--iters", str(iters), "--ignore-eos",
        "--no-progress", "--report-file", str(report), *extra,
    ]  # fmt: skip


def _summarise(out: Path) -> list[str]:
    """One line per arm of every report written, with the issue's targets checked."""
    lines = [
        "",
        "| report | arm | backend | tok/s best | roofline % | x hf-compile | match % | numerics |",
    ]
    lines.append("|---|---|---|---:|---:|---:|---:|---|")
    for path in sorted(out.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for entry in data.get("batch_sweep") or []:
            for arm in entry.get("arms", []):
                roof = arm.get("roofline") or {}
                share = roof.get("fraction_of_ceiling")
                lines.append(
                    f"| {path.stem} b{entry['batch']} | {arm['name']} | - | "
                    f"{_f(arm['tokens_per_s'].get('best'), '.1f')} | "
                    f"{_f(share and share * 100, '.1f')} ({roof.get('binding', '-')}) | - | - | - |"
                )
        check = data.get("reference_check")
        if isinstance(check, dict):
            kl = (check.get("metrics") or {}).get("kl_max")
            floor = (check.get("floor_metrics") or {}).get("kl_max")
            lines.append(
                f"| {path.stem} | eager vs {check.get('device')} {check.get('dtype')} | - | - | - "
                f"| - | - | {check.get('verdict')} (KL {_f(kl, '.2g')}, floor {_f(floor, '.2g')} "
                f"/ {_f(check.get('allowed_kl_max'), '.2g')}) |"
            )
        for arm in data.get("arms", []):
            roof = (arm.get("roofline") or {}).get("fraction_of_ceiling")
            match = (arm.get("token_match") or {}).get("rate")
            num = arm.get("numerics") or {}
            kl = (num.get("metrics_vs_float32") or num.get("metrics") or {}).get("kl_max")
            verdict = f"{num.get('verdict', '-')} (KL {_f(kl, '.2g')} / {_f(num.get('allowed_kl_max'), '.2g')})"
            lines.append(
                f"| {path.stem} | {arm['name']} | {(arm.get('details') or {}).get('backend', '-')} | "
                f"{_f(arm['tokens_per_s'].get('best'), '.1f')} | {_f(roof and roof * 100, '.1f')} | "
                f"{_f(arm.get('ratio_to_peer'), '.2f')} | {_f(match and match * 100, '.1f')} | "
                f"{verdict if num else '-'} |"
            )
    return lines


def _f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "device-out"))
    ap.add_argument("--budget-s", type=float, default=float(os.environ.get("BUDGET_S", 540)))
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny models: plumbing only")
    ap.add_argument("--skip-7b", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Model folders stay outside --out: $OUT comes back from the device machine.
    work = Path(os.environ.get("WORK") or tempfile.mkdtemp(prefix="pypto-decode-check-"))
    steps = Steps(out, args.budget_s)
    if args.dry_run:
        device, dtype, gen, iters, gen7 = "cpu", "float32", 6, 1, 6
        small, big, hybrid = {}, {}, {}
        batches = "1,2"
    else:
        from bench_e2e_cpu import QWEN05_SHAPE  # tools/ is on sys.path when run from there

        device, dtype, gen, iters, gen7 = "cuda:0", "bfloat16", 128, 5, 64
        from bench_hybrid_cpu import SHAPES as HYBRID_SHAPES

        small, big = QWEN05_SHAPE, QWEN7B_SHAPE
        hybrid = HYBRID_SHAPES["qwen3_5"][1]
        batches = "1,8,32"
    steps.run(
        "env",
        [sys.executable, "-c", "import torch, transformers, sys; print(sys.version.split()[0], "
         "torch.__version__, transformers.__version__, torch.cuda.is_available() and "
         "torch.cuda.get_device_name(0))"],
        30,
    )  # fmt: skip
    steps.run("build_05b", _build(work, "q05b", "qwen2", dtype, small), 120)
    m05 = work / "q05b"
    arms = ("--arms", "eager,graph,hf-compile")
    steps.run("b1_05b", _bench(m05, out / "b1_05b.json", device, dtype, gen, iters, *arms), 240)
    steps.run(
        "b1_05b_cudagraph",
        _bench(m05, out / "b1_05b_cudagraph.json", device, dtype, gen, iters,
               "--arms", "graph", "--graph-backend", "cudagraph" if not args.dry_run else "compile"),
        120,
    )  # fmt: skip
    steps.run(
        "sweep_05b",
        _bench(m05, out / "sweep_05b.json", device, dtype, gen // 2, max(1, iters - 2),
               "--arms", "eager,graph", "--batch", batches),
        180,
    )  # fmt: skip
    # Is the device's eager arm right at all (issue #42)? The gate holds graph to eager on the
    # device; --reference cpu holds eager to the CPU float32 copy, teacher-forced, in both
    # half types.
    for half in ("bfloat16", "float16"):
        steps.run(
            f"ref_05b_{half}",
            _bench(m05, out / f"ref_05b_{half}.json", device, dtype if args.dry_run else half,
                   min(gen, 32), 2, "--arms", "eager,graph", "--reference", "cpu"),
            180,
        )  # fmt: skip
    steps.run("build_hybrid", _build_arch(work, "hybrid", "qwen3_5_text", dtype, hybrid), 120)
    steps.run(
        "b1_hybrid",
        _bench(work / "hybrid", out / "b1_hybrid.json", device, dtype, gen, iters, *arms),
        240,
    )
    if not args.skip_7b:
        steps.run("build_7b", _build(work, "q7b", "qwen2", dtype, big), 240)
        steps.run(
            "b1_7b",
            _bench(work / "q7b", out / "b1_7b.json", device, dtype, gen7, max(1, iters - 2), *arms),
            300,
        )
    steps.lines.extend(_summarise(out))
    (out / "summary.md").write_text("\n".join(steps.lines) + "\n")
    print("\n".join(_summarise(out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
