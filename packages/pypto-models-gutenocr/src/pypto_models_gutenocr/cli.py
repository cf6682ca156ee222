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
from .runner import AskOptions, run, summarize, write_json


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", default="你好")
    p.add_argument(
        "--device",
        default="auto",
        help="auto | N (card N: npu:N, else cuda:N; 0 is cpu when neither exists) | cpu | "
        "cuda:N | npu:N",
    )
    p.add_argument("--model-path", default=None, help="model folder (default $GUTENOCR_MODEL_PATH)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--use_compile", action="store_true", help="torch.compile the forward")
    p.add_argument(
        "--use_acl_graph",
        action="store_true",
        help="graph mode: torchair when installed, else torch.compile reduce-overhead",
    )
    p.add_argument(
        "--use_dynamic_config",
        action="store_true",
        help="choose switches by batch size (DynamicPTOConfig)",
    )
    p.add_argument(
        "--policy-file", default=None, help="JSON batch policy (default: the seed policy)"
    )
    p.add_argument("--simple_prompt", action="store_true", help="raw prompt, no chat template")
    p.add_argument("--backend", default=None, help="torch.compile backend (default inductor)")
    p.add_argument("--mode", default=None, help="torch.compile / torchair mode")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--output_length", type=int, default=50)
    p.add_argument("--image", default=None, help="image file to OCR through the processor")
    p.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32 | float16")
    p.add_argument("--report-file", default=None)
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pypto-gutenocr",
        description=__doc__.splitlines()[0],
        epilog="exit codes: " + "; ".join(f"{e.code} {e.name}: {e.meaning}" for e in EXIT),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="generate once and report")
    _common(ask)
    ask.add_argument("--use_pto", action="store_true", help="switch the PyPTO kernels on")
    bench = sub.add_parser("bench", help="baseline then pypto phases, two reports and a summary")
    _common(bench)
    bench.add_argument("--runs", type=int, default=3, help="timed runs per phase")
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
        runs=getattr(args, "runs", 1),
    )


def _human(report: dict) -> str:
    k = report["kernels"]["calls"]
    ran = ", ".join(f"{op}: pypto {c['pypto']} / reference {c['reference']}" for op, c in k.items())
    return (
        f"{report['tokens']} tokens in {report['generate_s']:.3f} s "
        f"({report['tok_per_s']:.2f} tok/s, load {report['load_s']:.2f} s, graph {report['graph']['graph']}); "
        f"kernels: {ran}"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    try:
        if args.command == "ask":
            report = run(_options(args, args.use_pto))
            if args.report_file:
                write_json(args.report_file, report)
            if args.json:
                print(json.dumps(report, ensure_ascii=False))
            else:
                print("\n".join(report["text"]))
            print(_human(report), file=sys.stderr)
            return EXIT.OK
        base_opts = _options(args, False)
        baseline = run(base_opts)
        pypto = run(replace(base_opts, use_pto=True))
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
