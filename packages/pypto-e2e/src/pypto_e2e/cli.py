"""``pypto-e2e``: a thin CLI over :func:`pypto_e2e.run` and :func:`pypto_e2e.run_demo`.

stdout carries only what a shell consumes: ``export MODEL_PATH=...`` and, last,
``export PYPTO_REPORT=<report.md>`` (or one JSON object with ``--json``); progress and
the human report go to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from . import __version__
from .pipeline import STEPS, BadRunInputError, E2EError, RunConfig, RunResult, run

EXIT_ARM_FAILED = 1


def _pairs(values: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise BadRunInputError(
                f"{flag} {item!r} is not KEY=VALUE: write e.g. {flag} AutoModelForCausalLM=modeling_x.Cls"
            )
        out[key] = value
    return out


def _steps(value: str | None) -> tuple[str, ...]:
    return tuple(s.strip() for s in value.split(",") if s.strip()) if value else ()


def _add_bench_options(p: argparse.ArgumentParser, *, gen: int, warmup: int) -> None:
    g = p.add_argument_group("smoke and bench (passed to pypto-bench)")
    g.add_argument("--device", default="0", help="0 (npu:0, cuda:0 or cpu), cpu, cuda:1, npu:0 ...")
    g.add_argument(
        "--regime", default="decode", choices=("prefill", "decode", "diffusion-generate")
    )
    g.add_argument("--arms", default="eager,graph", help="comma list of eager, graph, pypto+graph")
    g.add_argument(
        "--fuse", action="store_true", help="also run pypto+graph and compare it with graph"
    )
    g.add_argument("--seq", type=int, default=16)
    g.add_argument("--gen", type=int, default=gen)
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--warmup", type=int, default=warmup)
    g.add_argument("--iters", type=int, default=3)
    g.add_argument("--dtype", default="auto")
    g.add_argument("--graph-backend", default="auto")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--attn-implementation", default=None)
    g.add_argument("--prompt", default=None, help="smoke-gate prompt")
    g.add_argument(
        "--trust-remote-code",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default: on only when the patch step pinned the model to in-repo code",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pypto-e2e", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="download -> patch -> smoke -> bench -> report (resumable)")
    r.add_argument(
        "--model-id", help="ORG/REPO on the hub (or the mirror in --endpoint / HF_ENDPOINT)"
    )
    r.add_argument("--work-dir", required=True, help="where the model, manifest and report go")
    r.add_argument("--model-path", help="an existing model folder (with --skip download)")
    d = r.add_argument_group("download (passed to pypto-download)")
    d.add_argument("--revision")
    d.add_argument("--token", help="hub token (default $HF_TOKEN); never printed or recorded")
    d.add_argument("--endpoint", help="hub mirror URL (default $HF_ENDPOINT)")
    d.add_argument("--allow-pattern", action="append", dest="allow_patterns")
    d.add_argument("--ignore-pattern", action="append", dest="ignore_patterns")
    d.add_argument("--max-workers", type=int, default=8)
    pa = r.add_argument_group("patch (passed to pypto-patch)")
    pa.add_argument("--family", help="preset name (see `pypto-patch list`)")
    pa.add_argument("--auto-map", action="append", metavar="KEY=VALUE")
    pa.add_argument("--copy", action="append", metavar="DEST=SOURCE")
    pa.add_argument("--source-root")
    _add_bench_options(r, gen=128, warmup=2)
    f = r.add_argument_group("flow")
    f.add_argument("--skip", help=f"comma list of steps to skip ({', '.join(STEPS)})")
    f.add_argument("--from", dest="from_step", choices=STEPS, help="re-run from this step on")
    r.add_argument("--json", action="store_true", help="stdout: one JSON object")
    r.add_argument("--quiet", action="store_true")

    dm = sub.add_parser("demo", help="the whole workflow offline on the embedded demo model (CPU)")
    dm.add_argument(
        "--work-dir", default=None, help="default $PYPTO_DEMO_WORKDIR or ./pypto-demo-work"
    )
    dm.add_argument("--gen", type=int, default=64)
    dm.add_argument("--iters", type=int, default=3)
    dm.add_argument("--from", dest="from_step", choices=STEPS)
    dm.add_argument("--json", action="store_true")
    dm.add_argument("--quiet", action="store_true")
    return parser


def _emit(result: RunResult, args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return
    if result.report_markdown and not args.quiet:
        sys.stderr.write("\n" + result.report_markdown.read_text() + "\n")
    if result.model_path:
        print(f"export MODEL_PATH={result.model_path}")
    if result.report_markdown:
        print(f"export PYPTO_REPORT={result.report_markdown}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(message)s",
        stream=sys.stderr,
    )
    say = (
        (lambda _msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    )
    try:
        if args.command == "demo":
            from .demo import run_demo

            overrides = {"gen": args.gen, "iters": args.iters, "from_step": args.from_step}
            overrides["command_line"] = ["pypto-e2e", *(argv if argv is not None else sys.argv[1:])]
            result = run_demo(args.work_dir, progress=say, **overrides)
        else:
            config = RunConfig(
                work_dir=args.work_dir,
                model_id=args.model_id,
                model_path=args.model_path,
                revision=args.revision,
                token=args.token,
                endpoint=args.endpoint,
                allow_patterns=args.allow_patterns,
                ignore_patterns=args.ignore_patterns,
                max_workers=args.max_workers,
                family=args.family,
                auto_map=_pairs(args.auto_map, "--auto-map"),
                copies=_pairs(args.copy, "--copy"),
                source_root=args.source_root,
                device=args.device,
                prompt=args.prompt,
                trust_remote_code=args.trust_remote_code,
                regime=args.regime,
                arms=tuple(a.strip() for a in args.arms.split(",") if a.strip()),
                fuse=args.fuse,
                seq=args.seq,
                gen=args.gen,
                batch=args.batch,
                warmup=args.warmup,
                iters=args.iters,
                dtype=args.dtype,
                graph_backend=args.graph_backend,
                seed=args.seed,
                attn_implementation=args.attn_implementation,
                skip=_steps(args.skip),
                from_step=args.from_step,
                command_line=["pypto-e2e", *(argv if argv is not None else sys.argv[1:])],
            )
            result = run(config, progress=say)
    except E2EError as err:
        print(f"pypto-e2e: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("pypto-e2e: interrupted: re-run the same command to resume", file=sys.stderr)
        return 130
    _emit(result, args)
    if result.failed_arms:
        print(
            f"pypto-e2e: error: arm(s) failed in the bench step: {', '.join(result.failed_arms)} "
            "(the report records why)",
            file=sys.stderr,
        )
        return EXIT_ARM_FAILED
    return 0
