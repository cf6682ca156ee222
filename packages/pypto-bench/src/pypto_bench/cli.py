"""``pypto-bench smoke | run | compare``: a thin argparse layer over the library.

Errors become one line on stderr and an exit code (README "Exit codes"). Human output
(tables, progress) goes to stderr; ``--json`` puts one JSON document on stdout.
The NPU environment variables are set from ``--device`` *before* torch is imported,
because the NPU allocator reads its configuration when the device initialises.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from .errors import EXIT_BAD_INPUT, EXIT_JOB_FAILED, EXIT_OK, BenchError

log = logging.getLogger("pypto_bench")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pypto-bench", description=__doc__.splitlines()[0])
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    def model_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--model-path",
            default=os.environ.get("MODEL_PATH"),
            help="model folder (default $MODEL_PATH)",
        )
        sp.add_argument(
            "--device", default="0", help="0 -> npu:0, cuda:0 or cpu; or cpu, cuda:1, npu:0 ..."
        )
        sp.add_argument(
            "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"]
        )
        sp.add_argument(
            "--trust-remote-code", action="store_true", help="allow the folder's own model code"
        )
        sp.add_argument("--attn-implementation", default=None, help="e.g. eager, sdpa")
        sp.add_argument("--json", action="store_true", help="one JSON document on stdout")

    sm = sub.add_parser("smoke", help="load offline, generate a few tokens, check the output")
    model_args(sm)
    sm.add_argument("--prompt", default=None)
    sm.add_argument("--max-new-tokens", type=int, default=16)
    sm.add_argument("--strict", action="store_true", help="fail when the coherence score is low")
    sm.add_argument("--min-coherence", type=float, default=None)

    run = sub.add_parser("run", help="benchmark arms in one regime and write a report")
    model_args(run)
    run.add_argument("--regime", default="decode", help="prefill | decode | diffusion-generate")
    run.add_argument("--seq", type=int, default=16, help="prompt length in tokens")
    run.add_argument(
        "--gen", type=int, default=128, help="tokens (or diffusion positions) to generate"
    )
    run.add_argument("--batch", type=int, default=1)
    run.add_argument(
        "--arms", default="eager,graph", help="comma list of eager, graph, pypto+graph"
    )
    run.add_argument("--warmup", type=int, default=2)
    run.add_argument("--iters", type=int, default=3)
    run.add_argument(
        "--graph-backend", default="auto", help="auto | compile | cudagraph | npugraph | eager"
    )
    run.add_argument(
        "--compile-mode",
        default=None,
        help="torch.compile mode for the compile backend (CPU), e.g. max-autotune-no-cudagraphs",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument(
        "--ignore-eos",
        action="store_true",
        help="always generate --gen tokens (eager: min_new_tokens)",
    )
    run.add_argument(
        "--diffusion-steps", type=int, default=None, help="denoising steps (default --gen)"
    )
    run.add_argument(
        "--block-length", type=int, default=None, help="diffusion block length (default --gen)"
    )
    run.add_argument(
        "--no-bandwidth", action="store_true", help="skip the bandwidth measurement (no roofline)"
    )
    run.add_argument("--report-file", default=None, help="write the JSON report here")
    run.add_argument(
        "--markdown", action="store_true", help="print the markdown rendering to stderr"
    )
    run.add_argument("--no-progress", action="store_true")

    cmp = sub.add_parser("compare", help="ratios between reports")
    cmp.add_argument("reports", nargs="+")
    cmp.add_argument(
        "--force", action="store_true", help="compare across regimes or machines anyway"
    )
    cmp.add_argument(
        "--markdown", action="store_true", help="print markdown instead of a text table"
    )
    cmp.add_argument("--plot", default=None, help="write a bar chart PNG here")
    cmp.add_argument("--json", action="store_true")
    return p


def _err(msg: str) -> None:
    print(f"pypto-bench: error: {msg}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return EXIT_OK if exc.code == 0 else EXIT_BAD_INPUT
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.command in ("smoke", "run"):
        from .environment import prepare_device_env

        for warning in prepare_device_env(args.device):
            print(f"pypto-bench: warning: {warning}", file=sys.stderr)
    try:
        if args.command == "smoke":
            return _smoke(args)
        if args.command == "run":
            return _run(args, ["pypto-bench", *args_list])
        return _compare(args)
    except BenchError as err:
        _err(str(err))
        return err.exit_code
    except KeyboardInterrupt:
        _err("interrupted")
        return 130


def _smoke(args: argparse.Namespace) -> int:
    from .smoke import DEFAULT_MIN_COHERENCE, DEFAULT_PROMPT, smoke

    res = smoke(
        args.model_path,
        prompt=args.prompt or DEFAULT_PROMPT,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
        dtype=args.dtype,
        trust_remote_code=args.trust_remote_code,
        attn_implementation=args.attn_implementation,
        strict=args.strict,
        min_coherence=args.min_coherence
        if args.min_coherence is not None
        else DEFAULT_MIN_COHERENCE,
    )
    if args.json:
        print(json.dumps(res.to_dict()))
    else:
        print(res.prompt + res.text)
    score = "-" if res.coherence is None else f"{res.coherence:.2f}"
    verdict = "PASS" if res.passed else f"FAIL ({res.stage})"
    print(f"smoke {verdict}: coherence {score} on {res.device}", file=sys.stderr)
    if not res.passed:
        _err(res.reason or "smoke gate failed")
    return res.exit_code


class _Progress:
    """tqdm bar on stderr, one per arm."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = (enabled and sys.stderr.isatty()) or (
            enabled and os.environ.get("PYPTO_BENCH_PROGRESS") == "1"
        )
        self.bar: Any = None
        self.arm: str | None = None

    def __call__(self, arm: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        if arm != self.arm:
            self.close()
            self.arm = arm
            self.bar = tqdm(total=total, desc=f"{arm:>12}", file=sys.stderr, unit="it", leave=True)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _run(args: argparse.Namespace, command_line: list[str]) -> int:
    from .bench import BenchConfig, run_bench
    from .report import format_table, report_to_markdown

    config = BenchConfig(
        model_path=args.model_path,
        device=args.device,
        regime=args.regime,
        seq=args.seq,
        gen=args.gen,
        batch=args.batch,
        arms=tuple(a.strip() for a in args.arms.split(",") if a.strip()),
        warmup=args.warmup,
        iters=args.iters,
        dtype=args.dtype,
        graph_backend=args.graph_backend,
        compile_mode=args.compile_mode,
        seed=args.seed,
        attn_implementation=args.attn_implementation,
        trust_remote_code=args.trust_remote_code,
        ignore_eos=args.ignore_eos,
        diffusion_steps=args.diffusion_steps,
        block_length=args.block_length,
        report_file=args.report_file,
        measure_bandwidth=not args.no_bandwidth,
        command_line=command_line,
    )
    progress = _Progress(not args.no_progress)
    try:
        report = run_bench(config, progress=progress)
    finally:
        progress.close()
    print(report_to_markdown(report) if args.markdown else format_table(report), file=sys.stderr)
    if args.json:
        print(report.to_json())
    if args.report_file:
        print(f"report written to {args.report_file}", file=sys.stderr)
    if not report.ok:
        _err(f"arm(s) failed: {', '.join(report.failed_arms)} (details in the report)")
        return EXIT_JOB_FAILED
    return EXIT_OK


def _compare(args: argparse.Namespace) -> int:
    from .compare import compare, plot

    if len(args.reports) < 2:
        _err("compare needs at least two report files")
        return EXIT_BAD_INPUT
    if args.plot:
        from pathlib import Path

        from .report import check_report_path

        if Path(args.plot).suffix.lower() != ".png":
            _err(f"--plot {args.plot}: the chart is a PNG, name the file *.png")
            return EXIT_BAD_INPUT
        check_report_path(args.plot)
    comp = compare(args.reports, force=args.force)
    if args.json:
        print(json.dumps(comp.to_dict()))
    elif args.markdown:
        print(comp.to_markdown())
    else:
        print(comp.to_text())
    if args.plot:
        plot(list(args.reports), args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
