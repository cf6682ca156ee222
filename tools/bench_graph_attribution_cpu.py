#!/usr/bin/env python3
"""pypto-tune compare, eager vs graph arm, before and after the graph arm's attribution.

For each model (the tiny llama; a Qwen2.5-0.5B-shaped qwen2, hidden 896, 24 layers, fp32,
seeded random weights), decode batch 1, seq 16: the eager and the graph arm are profiled
(light level, one process each, as `pypto-tune profile` runs) and compared with
`pypto-tune compare`, once with this tree's pypto-tune and once with another checkout's
(``--before-src``, e.g. a worktree of the commit before attribution landed), so the two
compare tables stand side by side. The attribution pass's cost (its extra compile) and
the profiled graph step with and without per-kernel ranges are reported from the same
profiles.

    git worktree add /tmp/before <commit>
    python tools/bench_graph_attribution_cpu.py --before-src /tmp/before [--skip-05b] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## pypto-tune: inside the captured step (graph-arm attribution)"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e_cpu import tool_models, write_section  # noqa: E402  (the tools share the models and the doc writer)


def _env(src: Path) -> dict[str, str]:
    paths = [str(p) for p in sorted((src / "packages").glob("*/src"))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _tune(src: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pypto_tune", *args]
    got = subprocess.run(cmd, env=_env(src), capture_output=True, text=True, check=False)
    if got.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({got.returncode}): {got.stderr[-2000:]}")
    return got


def _profile(src: Path, model: Path, arm: str, out: Path, gen: int, iters: int) -> dict:
    flags = ["--regime", "decode", "--seq", "16", "--gen", str(gen), "--device", "cpu"]
    _tune(src, "profile", "--model-path", str(model), *flags, "--arm", arm,
          "--iters", str(iters), "--out", str(out), "-q")  # fmt: skip
    return json.loads((out / "profile.json").read_text())


def _compare(src: Path, base: Path, opt: Path) -> tuple[dict, str]:
    data = json.loads(_tune(src, "compare", str(base), str(opt), "--json").stdout)
    md = _tune(src, "compare", str(base), str(opt)).stderr
    return data, md


def run(model: Path, work: Path, before: Path | None, gen: int, iters: int) -> dict:
    out: dict = {}
    for label, src in (("after", ROOT), ("before", before)):
        if src is None:
            continue
        d = work / label
        d.mkdir(parents=True, exist_ok=True)
        eager = _profile(src, model, "eager", d / "eager", gen, iters)
        graph = _profile(src, model, "graph", d / "graph", gen, iters)
        data, md = _compare(src, d / "eager" / "profile.json", d / "graph" / "profile.json")
        out[label] = {
            "eager_step_us": eager["step"]["time_us"]["mean"],
            "graph_step_us": graph["step"]["time_us"]["mean"],
            "graph_blocks": {k: v["us"] for k, v in graph["blocks"].items()},
            "eager_blocks": {k: v["us"] for k, v in eager["blocks"].items()},
            "attribution": graph["meta"].get("attribution"),
            "compare": data,
            "compare_md": md,
        }
        print(f"[{model.name}] {label}: done", file=sys.stderr, flush=True)
    return out


def _blocks_table(r: dict) -> list[str]:
    after = r["after"]["compare"]["blocks"]
    before = r.get("before", {}).get("compare", {}).get("blocks", {})
    lines = [
        "| block | eager us | graph us, before | graph us, after | after: verdict |",
        "|---|---:|---:|---:|---|",
    ]
    names = sorted(set(after) | set(before), key=lambda n: -after.get(n, {}).get("base_us", 0))
    for n in names:
        a, b = after.get(n, {}), before.get(n, {})
        lines.append(
            f"| {n} | {a.get('base_us', 0):.1f} | {b.get('opt_us', 0):.1f} | "
            f"{a.get('opt_us', 0):.1f} | {a.get('verdict') or '-'} |"
        )
    return lines


def _markdown(rows: list[tuple[str, dict]], argv: list[str]) -> str:
    import torch

    lines = [
        SECTION,
        "",
        f"Command: `python tools/bench_graph_attribution_cpu.py {' '.join(argv)}` on "
        f"{platform.machine()} ({os.cpu_count()} cores, shared), torch {torch.__version__}; "
        "decode, batch 1, seq 16, fp32, light level; `before` is the tree before issue #29 "
        "(the graph arm one `captured` block), `after` this tree. Per decode step, mean of "
        "the profiled steps; each profile in its own process.",
        "",
    ]
    for name, r in rows:
        a = r["after"]
        att = a["attribution"] or {}
        cost = (att.get("cost") or {}).get("compile_s")
        lines += [f"### {name}", ""]
        lines += _blocks_table(r)
        lines += [
            "",
            f"Step: eager {a['eager_step_us'] / 1e3:.2f} ms, graph {a['graph_step_us'] / 1e3:.2f} ms "
            f"(after)"
            + (
                f", graph {r['before']['graph_step_us'] / 1e3:.2f} ms (before: no per-kernel "
                "ranges)"
                if "before" in r
                else ""
            )
            + f". Attribution: {att.get('status')}, {att.get('kernels_matched')} kernels over "
            f"{att.get('calls')} graph calls ({sum(att.get('kernels_per_call') or [0])} per call), "
            f"{att.get('fused_across')} fused across modules; the attribution pass compiled for "
            f"{cost:.1f} s outside the profiled steps."
            if cost is not None
            else "",
            "",
        ]
        layers = a["compare"].get("layers") or {}
        if layers:
            top = sorted(layers.items(), key=lambda kv: -kv[1]["opt_us"])[:3]
            lines.append(
                "Slowest graph-arm layers: "
                + ", ".join(
                    f"layer {k} {v['opt_us']:.1f} us (eager {v['base_us']:.1f})" for k, v in top
                )
                + "."
            )
            lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--before-src", type=Path, default=None, help="checkout to compare against")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--skip-05b", action="store_true")
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-attrib-"))
    work.mkdir(parents=True, exist_ok=True)
    models = tool_models(work, big=not args.skip_05b, gens=(16, 8))
    rows = []
    for name, path, gen in models:
        r = run(path, work / (path.name + "-profiles"), args.before_src, gen, args.iters)
        rows.append((name, r))
        for label in ("before", "after"):
            if label in r:
                print(f"\n## {name}: {label}\n\n{r[label]['compare_md']}", file=sys.stderr)
        print(json.dumps({"model": name, **{k: {kk: vv for kk, vv in v.items() if kk != "compare_md"} for k, v in r.items()}}, default=str), flush=True)  # fmt: skip
    text = _markdown(rows, sys.argv[1:])
    print(text, file=sys.stderr)
    if args.write:
        write_section(text, SECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
