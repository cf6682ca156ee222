"""The support matrix over the zoo: every causal LM type transformers ships, every arm.

    python tools/zoo.py [--types newest:20 | --types a,b | --shard 1/8] [--backend eager]
                        [--peer] [--jobs 2] [--timeout 300] [--out DIR]

For each model type (pypto_testing.zoo: transformers' own config and model classes, a
generic small shape), one child process builds the tiny folder and runs pypto-bench's
decode and prefill regimes (eager and graph; ``--peer`` adds hf-compile to decode) through
``run_bench`` (one iteration, sequential schedule), and prints one JSON line per cell. The
parent bounds every child by ``--timeout`` (its whole process group is killed: a hang is a
cell, never a stuck matrix) and classifies every cell:

  ok         every arm ran and the numerical gate passed (or the arm is exempt, stated)
  refused    a one-line refusal (pypto-capture's UnsupportedModelError /
             CaptureUnsafeConfigError / CacheDoesNotFitError, a regime the model cannot run)
  WRONG      an arm failed the numerical gate: it computes something else than eager
  crash      an arm failed with another error (a bug: ours or the model's)
  hang       the child ran past --timeout
  eager fails  the model's own eager path fails at the tiny shape (transformers' code or the
             recipe, not a capture: nothing of ours to compare against)
  not built  the generic recipe cannot make the type small and runnable (why, in one line)
  peer fails our arms are ok; transformers' own compile recipe (hf-compile, ``--peer``)
             fails or computes otherwise on the same folder: said, not charged to us

Writes OUT/zoo.json (every cell) and OUT/zoo.md (the matrix, totals per class); exits 1
when any cell is WRONG, crash or hang (``--allow-fail`` reports them and exits 0).
``nox -s zoo`` runs it (flags after ``--``); the README test command runs the newest types
through tests-integration/test_zoo.py.
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
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pypto_testing.zoo_report import BAD_CLASSES, ZOO_CLASSES, render_zoo_matrix

REFUSALS = (
    "CacheApiNotSupportedError",
    "UnsupportedModelError",
    "CaptureUnsafeConfigError",
    "CacheDoesNotFitError",
    "RegimeNotSupportedError",
)
REGIMES = ("decode", "prefill")

#: Cell processes running now (each leads its own process group): a SIGTERM or Ctrl-C of
#: the matrix kills them before it exits, so no cell outlives the command.
_LIVE: set[subprocess.Popen[str]] = set()


def _end_children(signum: int, _frame: Any) -> None:
    for proc in list(_LIVE):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(128 + signum)


def _one_line(text: str, limit: int = 240) -> str:
    return " ".join(str(text).split())[:limit]


def classify_report(report: Any) -> tuple[str, str]:
    """(class, why) of one pypto-bench report (a ``Report``). Our arms (eager, graph)
    decide the class; transformers' own compile recipe (the hf-compile peer) failing or
    computing something else is "peer fails" when ours are ok: said, not charged to us."""
    peer = "hf-compile"
    wrong = [n for n in report.numerics_failed if n != peer]
    if wrong:
        why = "; ".join(
            f"{a.name}: {(a.numerics or {}).get('why')}" for a in report.arms if a.name in wrong
        )
        return "WRONG", _one_line(why)
    failed = [a for a in report.arms if not a.ok and a.name != peer]
    if failed:
        eager = next((a for a in failed if a.name == "eager"), None)
        if eager is not None:
            return "eager fails", _one_line(f"eager: {eager.error}")
        refused = [a for a in failed if str(a.error or "").startswith(REFUSALS)]
        cls = "refused" if len(refused) == len(failed) else "crash"
        first = (refused if cls == "refused" else [a for a in failed if a not in refused])[0]
        return cls, _one_line(f"{first.name}: {first.error}")
    theirs = next((a for a in report.arms if a.name == peer), None)
    if theirs is not None and not theirs.ok:
        return "peer fails", _one_line(f"{peer} (transformers' recipe): {theirs.error}")
    if peer in report.numerics_failed:
        why = (theirs.numerics or {}).get("why") if theirs is not None else None
        return "peer fails", _one_line(f"{peer} (transformers' recipe) computes otherwise: {why}")
    return "ok", ""


def run_cell(folder: Path, regime: str, backend: str, peer: bool) -> dict[str, Any]:
    """One regime of one folder, in this process: its class, why and per-arm verdicts."""
    from pypto_bench import BenchConfig, BenchError, run_bench

    arms = ["eager", "graph"] + (["hf-compile"] if peer and regime == "decode" else [])
    config = BenchConfig(
        model_path=str(folder), device="cpu", dtype="float32", regime=regime, seq=8, gen=8,
        warmup=0, iters=1, arms=tuple(arms), graph_backend=backend, schedule="sequential",
        measure_bandwidth=False,
    )  # fmt: skip
    start = time.perf_counter()
    try:
        report = run_bench(config)
    except BenchError as err:
        name = type(err).__name__
        cls = "refused" if name in ("RegimeNotSupportedError", "BadInputError") else "crash"
        if name == "ModelLoadError":  # the folder the recipe wrote does not load back
            cls = "not built"
        return {"class": cls, "why": _one_line(f"{name}: {err}"),
                "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip
    cls, why = classify_report(report)
    arms_out = {
        a.name: (
            "ok" if a.ok and (a.numerics or {}).get("verdict") != "fail" else
            ("numerics fail" if a.ok else _one_line(str(a.error), 120))
        )
        for a in report.arms
    }  # fmt: skip
    return {"class": cls, "why": why, "arms": arms_out,
            "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip


def child(model_type: str, backend: str, peer: bool) -> int:
    """``--cell TYPE``: build the folder, run each regime, one JSON line per cell."""
    import logging

    logging.disable(logging.WARNING)
    from pypto_testing.zoo import CannotBuildTiny, make_zoo_model, type_year

    year = type_year(model_type)
    with tempfile.TemporaryDirectory(prefix="pypto-zoo-") as tmp:
        try:
            folder = make_zoo_model(Path(tmp) / model_type, model_type)
        except CannotBuildTiny as err:
            print(json.dumps({"type": model_type, "year": year, "regime": "*",
                              "class": "not built", "why": _one_line(str(err))}), flush=True)  # fmt: skip
            return 0
        for regime in REGIMES:
            cell = run_cell(folder, regime, backend, peer)
            print(json.dumps({"type": model_type, "year": year, "regime": regime, **cell}),
                  flush=True)  # fmt: skip
    return 0


def _run_child(model_type: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    argv = [sys.executable, __file__, "--cell", model_type, "--backend", args.backend]
    if args.peer:
        argv.append("--peer")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "TORCHINDUCTOR_COMPILE_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    _LIVE.add(proc)
    try:
        out, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        _LIVE.discard(proc)
        done = _parse(out, model_type)
        seen = {c["regime"] for c in done}
        return done + [
            {"type": model_type, "regime": r, "class": "hang",
             "why": f"ran past {args.timeout:.0f} s (its process group was killed)"}
            for r in REGIMES if r not in seen
        ]  # fmt: skip
    _LIVE.discard(proc)
    cells = _parse(out, model_type)
    if proc.returncode != 0 or not cells:
        tail = _one_line((err or "").strip().splitlines()[-1] if (err or "").strip() else "")
        seen = {c["regime"] for c in cells}
        if "*" not in seen:
            cells += [
                {"type": model_type, "regime": r, "class": "crash",
                 "why": f"the cell process exited {proc.returncode}: {tail}"}
                for r in REGIMES if r not in seen
            ]  # fmt: skip
    return cells


def _parse(out: str, model_type: str) -> list[dict[str, Any]]:
    cells = []
    for line in (out or "").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                cell = json.loads(line)
            except ValueError:
                continue
            if cell.get("type") == model_type and cell.get("class") in ZOO_CLASSES:
                cells.append(cell)
    return cells


def select(spec: str | None, shard: str | None) -> list[str]:
    from pypto_testing.zoo import newest_types, zoo_types

    if spec and spec.startswith("newest:"):
        types = newest_types(int(spec.split(":", 1)[1]))
    elif spec:
        known = set(zoo_types())
        types = [t for t in spec.split(",") if t]
        unknown = [t for t in types if t not in known]
        if unknown:
            raise SystemExit(f"zoo: not causal-LM types here: {', '.join(unknown)}")
    else:
        types = newest_types()
    if shard:
        k, n = (int(x) for x in shard.split("/", 1))
        if not 1 <= k <= n:
            raise SystemExit(f"zoo: --shard K/N needs 1 <= K <= N (got {shard})")
        types = types[k - 1 :: n]
    return types


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", help="newest:N, or a comma list of model types (default: all)")
    ap.add_argument("--shard", help="K/N: every N-th type from the K-th (a CI-sized share)")
    ap.add_argument(
        "--backend", default="eager", help="pypto-bench --graph-backend (default eager)"
    )
    ap.add_argument("--peer", action="store_true", help="also the hf-compile arm in decode")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per type (default 300)")
    ap.add_argument("--out", type=Path, default=Path("zoo-out"))
    ap.add_argument("--allow-fail", action="store_true")
    ap.add_argument("--cell", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.cell:
        return child(args.cell, args.backend, args.peer)
    types = select(args.types, args.shard)
    signal.signal(signal.SIGTERM, _end_children)
    signal.signal(signal.SIGINT, _end_children)
    start = time.perf_counter()
    cells: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for got in pool.map(lambda t: _run_child(t, args), types):
            cells += got
            for c in got:
                print(f"zoo: {c['type']:<28} {c['regime']:<8} {c['class']:<9} {c.get('why', '')[:100]}",
                      file=sys.stderr, flush=True)  # fmt: skip
    import torch
    import transformers

    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "backend": args.backend, "peer": args.peer,
            "seconds": round(time.perf_counter() - start), "types": len(types),
            "command": "python tools/zoo.py " + " ".join(argv if argv is not None else sys.argv[1:])}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "zoo.json").write_text(json.dumps({"meta": meta, "cells": cells}, indent=1))
    title = "# Support matrix over the zoo (tools/zoo.py)"
    (args.out / "zoo.md").write_text(render_zoo_matrix({"meta": meta, "cells": cells}, title=title))
    bad = [c for c in cells if c["class"] in BAD_CLASSES]
    totals = Counter(c["class"] for c in cells)
    print(json.dumps({"types": len(types), "cells": dict(totals), "out": str(args.out)}))
    return 1 if bad and not args.allow_fail else 0


if __name__ == "__main__":
    raise SystemExit(main())
