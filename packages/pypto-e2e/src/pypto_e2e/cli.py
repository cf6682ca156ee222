"""``pypto-e2e``: a thin CLI over :func:`pypto_e2e.run` and :func:`pypto_e2e.run_demo`.

stdout carries only what a shell consumes: ``export MODEL_PATH=...`` and, last,
``export PYPTO_REPORT=<report.md>`` (or one JSON object with ``--json``); progress and
the human report go to stderr. Everything printed passes the project's redaction.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, ClassVar, NoReturn

from pypto_common import cli_logging, export_line, redact, redact_argv, redact_obj

from . import __version__
from .chain import RunResult, run
from .config import STEPS, RunConfig
from .errors import EXIT, BadRunInputError, E2EError

__all__ = ["OWN_LOGGERS", "build_parser", "main", "run_config_from_args"]

#: Loggers whose INFO lines are this tool's own; every other library stays at WARNING
#: unless -v (a hub client's "HTTP Request: GET ..." per file buried the step lines).
OWN_LOGGERS = ("pypto_e2e",)

# Bench flags e2e defines itself: the model folder comes from the download/patch steps,
# the report goes into the work dir, and remote code is decided by the patch step.
# (--history is pypto-bench's: the bench step records its report there.)
_BENCH_FLAGS_OWNED_HERE = ("model_path", "report_file", "trust_remote_code")


class _Parser(argparse.ArgumentParser):
    """argparse whose one-line usage errors are redacted (they echo argument values)."""

    secrets: ClassVar[list[str]] = []

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT.USAGE, f"{self.prog}: error: {redact(message, self.secrets)}\n")


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


def _add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="stdout: one JSON object")
    p.add_argument("--quiet", action="store_true", help="errors only on stderr")
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="also other libraries' INFO logs (hub requests...); -vv for DEBUG",
    )


def build_parser() -> argparse.ArgumentParser:
    from pypto_bench import add_bench_arguments

    parser = _Parser(prog="pypto-e2e", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser(
        "run",
        help="download -> patch -> smoke -> precision -> bench -> [tune] -> report (resumable)",
    )
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
    pa.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let a folder that no preset pins run its own code (default: only the code a "
        "preset pinned and pypto-patch verified runs)",
    )
    g = r.add_argument_group("smoke and bench (pypto-bench's flags)")
    add_bench_arguments(g, exclude=_BENCH_FLAGS_OWNED_HERE)
    g.add_argument(
        "--fuse", action="store_true", help="also run pypto+graph and compare it with graph"
    )
    g.add_argument("--prompt", default=None, help="smoke-gate prompt")
    t = r.add_argument_group("tune (pypto-tune; needs pip install 'pypto-e2e[tune]')")
    t.add_argument(
        "--tune",
        action="store_true",
        help="after the bench, profile its step and advise (WORK/report/tune/, linked in "
        "report.md)",
    )
    t.add_argument(
        "--tune-arm",
        default="eager",
        metavar="ARM",
        help="arm to profile: eager (default), graph or pypto+graph",
    )
    t.add_argument(
        "--tune-level",
        default="light",
        metavar="LEVEL",
        help="light (default: operators and modules) or detail (shapes, stacks, memory)",
    )
    t.add_argument(
        "--tune-iters", type=int, default=3, metavar="N", help="profiled iterations (default 3)"
    )
    f = r.add_argument_group("flow")
    f.add_argument("--skip", help=f"comma list of steps to skip ({', '.join(STEPS)})")
    f.add_argument("--from", dest="from_step", choices=STEPS, help="re-run from this step on")
    _add_output_options(r)

    dm = sub.add_parser("demo", help="the whole workflow offline on the embedded demo model (CPU)")
    dm.add_argument(
        "--work-dir", default=None, help="default $PYPTO_DEMO_WORKDIR or ./pypto-demo-work"
    )
    dm.add_argument("--gen", type=int, default=64)
    dm.add_argument("--iters", type=int, default=3)
    dm.add_argument("--from", dest="from_step", choices=STEPS)
    _add_output_options(dm)
    return parser


def run_config_from_args(args: argparse.Namespace, command_line: list[str]) -> RunConfig:
    """The RunConfig a parsed ``run`` command line asks for."""
    from pypto_bench import bench_config_from_args

    return RunConfig(
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
        bench=bench_config_from_args(args),
        prompt=args.prompt,
        trust_remote_code=args.trust_remote_code,
        fuse=args.fuse,
        tune=args.tune,
        tune_arm=args.tune_arm,
        tune_level=args.tune_level,
        tune_iters=args.tune_iters,
        skip=_steps(args.skip),
        from_step=args.from_step,
        command_line=command_line,
    )


def _emit(result: RunResult, args: argparse.Namespace, secrets: list[str]) -> None:
    if args.json:
        print(json.dumps(redact_obj(result.to_dict(), secrets), indent=2))
        return
    if result.report_markdown and not args.quiet:
        sys.stderr.write("\n" + result.report_markdown.read_text() + "\n")
        page = result.report_html
        if page is not None and page.is_file():  # written beside report.md
            print(
                redact(
                    f"pypto-e2e: report page: {page} (open it in a browser; works offline)", secrets
                ),
                file=sys.stderr,
            )
    if result.model_path:
        print(export_line("MODEL_PATH", result.model_path))
    if result.report_markdown:
        print(export_line("PYPTO_REPORT", result.report_markdown))


def _argv_secrets(argv: list[str]) -> list[str]:
    """Values the redaction masks in the raw command line (``--token X``, URL passwords)."""
    masked = redact_argv(argv)
    found = []
    for raw, shown in zip(argv, masked, strict=True):
        if raw != shown:
            found.append(raw.partition("=")[2] if raw.startswith("--") and "=" in raw else raw)
    return found


def _fail(err: E2EError, args: argparse.Namespace, secrets: list[str]) -> int:
    print(f"pypto-e2e: error: {redact(str(err), secrets)}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"ok": False, "error": err.to_dict(secrets)}, indent=2))
    return err.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    secrets = _argv_secrets(raw)
    _Parser.secrets = secrets
    args = build_parser().parse_args(raw)
    command_line = redact_argv(["pypto-e2e", *raw], secrets)
    verbosity = -1 if args.quiet else args.verbose
    with cli_logging(OWN_LOGGERS, verbosity, secrets=[*secrets, getattr(args, "token", None)]):
        return _main(args, secrets, command_line)


def _main(args: argparse.Namespace, secrets: list[str], command_line: list[str]) -> int:
    def say(msg: str) -> None:
        if not args.quiet:
            print(redact(msg, secrets), file=sys.stderr, flush=True)

    try:
        if args.command == "demo":
            from .demo import run_demo

            overrides: dict[str, Any] = {
                "gen": args.gen,
                "iters": args.iters,
                "from_step": args.from_step,
                "command_line": command_line,
            }
            result = run_demo(args.work_dir, progress=say, **overrides)
        else:
            config = run_config_from_args(args, command_line)
            secrets = [*secrets, *config.secrets()]
            result = run(config, progress=say)
    except E2EError as err:
        return _fail(err, args, secrets)
    except KeyboardInterrupt:
        print("pypto-e2e: interrupted: re-run the same command to resume", file=sys.stderr)
        return 130
    _emit(result, args, secrets)
    if result.remote_report and not args.quiet:
        # Not rank 0's node: its ranks' figures are in the report written there.
        print(
            "pypto-e2e: this node's ranks are done; the bench report is on the node that ran "
            "rank 0 (its pypto-e2e run printed PYPTO_REPORT)",
            file=sys.stderr,
        )
    if result.failed_arms:
        print(
            f"pypto-e2e: error: arm(s) failed in the bench step: {', '.join(result.failed_arms)} "
            "(the report records why)",
            file=sys.stderr,
        )
        return EXIT.ARM_FAILED
    return EXIT.OK
