"""``pypto-gutenocr``: ask (one generation, optionally on an image) and bench.

Exit codes come from :data:`pypto_models_gutenocr.EXIT` (0 ok, 1 the run failed, 2 bad
usage or input, 3 environment missing, 70 a PyPTO kernel failed inside its envelope,
71 the model folder did not load); ``--help`` lists them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path

from pypto_kernels_gutenocr import KernelError, PolicyError

from .configuration import MRopeSectionError
from .errors import EXIT, AskError
from .runner import (
    ASK_OUTPUT_LENGTH,
    BENCH_OUTPUT_LENGTH,
    DEFAULT_RUNS,
    DEFAULT_WARMUP,
    WARMUP_NEW_TOKENS,
    AskOptions,
    Plan,
    plan,
    run,
    summarize,
    write_json,
)

__all__ = ["build_parser", "main"]


def _common(p: argparse.ArgumentParser, output_length: int) -> None:
    p.add_argument("--prompt", default="你好", help="prompt text")
    p.add_argument(
        "--device",
        default="auto",
        help="auto | N (card N: npu:N, else cuda:N; 0 is cpu when neither exists) | cpu | "
        "cuda:N | npu:N",
    )
    p.add_argument("--model-path", default=None, help="model folder (None: $GUTENOCR_MODEL_PATH)")
    p.add_argument(
        "--warmup",
        type=int,
        default=DEFAULT_WARMUP,
        help=f"untimed warmup generations of {WARMUP_NEW_TOKENS} new tokens each",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=DEFAULT_RUNS,
        help="synchronised timed runs (per phase for bench); the mean is reported, "
        "best / median / stdev beside it",
    )
    p.add_argument("--use_compile", action="store_true", help="torch.compile the forward")
    p.add_argument(
        "--use_acl_graph",
        action="store_true",
        help="graph mode: torchair (mode reduce-overhead, frozen_parameter and "
        "tiling_schedule_optimize on) when installed, else plain torch.compile (stated on "
        "stderr); torch.compile(dynamic=True, fullgraph=True) either way",
    )
    p.add_argument(
        "--use_dynamic_config",
        action="store_true",
        help="switches (and aclgraph) chosen per batch by the measured batch policy; "
        "implies --use_pto",
    )
    p.add_argument(
        "--policy-file",
        default=None,
        help="JSON batch policy (None: the measured policy shipped in pypto-kernels-gutenocr)",
    )
    p.add_argument("--simple_prompt", action="store_true", help="raw prompt, no chat template")
    p.add_argument(
        "--backend", default=None, help="torch.compile backend (None: inductor; torchair on NPU)"
    )
    p.add_argument(
        "--mode",
        default=None,
        help="torch.compile / torchair mode (None: reduce-overhead with --use_acl_graph, "
        "torch's default with --use_compile)",
    )
    p.add_argument("--batch", type=int, default=1, help="identical requests per generate call")
    p.add_argument(
        "--output_length",
        type=int,
        default=output_length,
        help="new tokens per timed run (min and max, greedy)",
    )
    p.add_argument("--image", default=None, help="image file to OCR through the processor")
    p.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32 | float16")
    p.add_argument("--report-file", default=None, help="also write the JSON report here")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pypto-gutenocr",
        description=__doc__.splitlines()[0],
        epilog="exit codes: " + "; ".join(f"{e.code} {e.name}: {e.meaning}" for e in EXIT),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fmt = argparse.ArgumentDefaultsHelpFormatter
    ask = sub.add_parser("ask", help="generate and report", formatter_class=fmt)
    _common(ask, ASK_OUTPUT_LENGTH)
    ask.add_argument("--use_pto", action="store_true", help="switch the PyPTO kernels on")
    bench = sub.add_parser(
        "bench", help="baseline then pypto phases, two reports and a summary", formatter_class=fmt
    )
    _common(bench, BENCH_OUTPUT_LENGTH)
    bench.add_argument("--output-dir", default="gutenocr-bench", help="where the JSON reports go")
    return parser


def _options(args: argparse.Namespace, use_pto: bool) -> AskOptions:
    return AskOptions(
        model_path=args.model_path,
        prompt=args.prompt,
        device=args.device,
        warmup=args.warmup,
        use_pto=use_pto,
        use_compile=args.use_compile,
        use_acl_graph=args.use_acl_graph,
        use_dynamic_config=args.use_dynamic_config,
        policy_file=args.policy_file,
        simple_prompt=args.simple_prompt,
        backend=args.backend,
        mode=args.mode,
        batch=args.batch,
        output_length=args.output_length,
        image=args.image,
        dtype=args.dtype,
        runs=args.runs,
    )


def _human(report: dict) -> str:
    k = report["kernels"]["calls"]
    ran = ", ".join(f"{op}: pypto {c['pypto']} / reference {c['reference']}" for op, c in k.items())
    st = report["generate_s_stats"]
    peak = report["peak_memory"]["peak_allocated"]
    peak_s = "n/a" if peak is None else f"{peak / 2**20:.0f} MiB"
    return (
        f"{report['tokens']} tokens in {report['generate_s']:.3f} s mean of {report['runs']} "
        f"(best {st['best']:.3f}, median {st['median']:.3f}, stdev {st['stdev']:.3f}; "
        f"{report['tok_per_s']:.2f} tok/s, load {report['load_s']:.2f} s, peak {peak_s} "
        f"{report['peak_memory']['kind']}, graph {report['graph']['graph']}); kernels: {ran}"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    try:
        the_plan = plan(_options(args, args.command == "bench" or args.use_pto))
        for line in the_plan.lines():
            print(f"pypto-gutenocr: {line}", file=sys.stderr)
        if args.command == "ask":
            report = run(the_plan)
            if args.report_file:
                write_json(args.report_file, report)
            if args.json:
                print(json.dumps(report, ensure_ascii=False))
            else:
                print("\n".join(report["text"]))
            print(_human(report), file=sys.stderr)
            return EXIT.OK
        # The baseline keeps the pypto phase's graph mode, so the delta is the kernels'.
        base = replace(the_plan.opts, use_pto=False, use_dynamic_config=False)
        baseline = run(Plan(base, notes=["baseline phase: switches off, same graph mode"]))
        pypto = run(the_plan)
        summary = summarize(baseline, pypto)
        out = Path(args.output_dir)
        write_json(out / "baseline.json", baseline)
        write_json(out / "pypto.json", pypto)
        write_json(out / "summary.json", summary)
        if args.report_file:
            write_json(args.report_file, summary)
        if args.json:
            print(json.dumps(summary))
        for key, row in summary["metrics"].items():
            d = row["delta_pct"]
            print(
                f"{key:18s} baseline {row['baseline']!s:>14.14} pypto {row['pypto']!s:>14.14} "
                f"delta {'n/a' if d is None else f'{d:+.1f}%'}",
                file=sys.stderr,
            )
        r = summary["ratio"]
        print(
            "pypto/baseline tok/s "
            + (
                f"{r['median']:.2f}x [{r['low']:.2f}, {r['high']:.2f}] ({r['level']:.0%}, "
                f"{r['method']}); {summary['schedule']['why']}"
                if r
                else "n/a (no timed runs)"
            ),
            file=sys.stderr,
        )
        return EXIT.OK
    except KernelError as err:
        print(f"pypto-gutenocr: {err} (run with the switch off to compare)", file=sys.stderr)
        return EXIT.KERNEL_FAILED
    except (PolicyError, MRopeSectionError) as err:
        print(f"pypto-gutenocr: {err}", file=sys.stderr)
        return EXIT.USAGE
    except AskError as err:
        print(f"pypto-gutenocr: {err}", file=sys.stderr)
        return err.exit_code
    except ImportError as err:
        print(f"pypto-gutenocr: missing dependency: {err} (pip install it)", file=sys.stderr)
        return EXIT.ENVIRONMENT


if __name__ == "__main__":
    sys.exit(main())
