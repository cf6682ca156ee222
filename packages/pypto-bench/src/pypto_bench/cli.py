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
import shlex
import sys
from typing import Any, NoReturn

from pypto_common import add_verbosity_flags, cli_logging, redact, redact_obj
from pypto_common.visible import visible

from .args import FLAG_FOR, add_bench_arguments
from .errors import EXIT, BenchError, HistoryError

__all__ = [
    "OWN_LOGGERS",
    "main",
]

log = logging.getLogger("pypto_bench")

# Loggers whose INFO lines are this tool's own; everything else stays at WARNING
# unless -v (a hub client or transformers at INFO buries the bench's lines).
OWN_LOGGERS = ("pypto_bench", "pypto_capture")

# The smoke gate loads and generates once: the model flags apply (and --image, one more
# forward on an image prompt), the timing ones do not.
_MODEL_FLAGS = (
    "model_path",
    "device",
    "dtype",
    "trust_remote_code",
    "attn_implementation",
    "image",
)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one redacted line (the tool's error format)."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            EXIT.USAGE,
            f"pypto-bench: error: {redact(message)} (`{self.prog} --help` lists the flags)\n",
        )


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pypto-bench", description=__doc__.splitlines()[0])
    add_verbosity_flags(p, top=True)
    sub = p.add_subparsers(dest="command", required=True)
    env_defaults = {"model_path": os.environ.get("MODEL_PATH")}

    sm = sub.add_parser("smoke", help="load offline, generate a few tokens, check the output")
    add_verbosity_flags(sm, top=False)
    add_bench_arguments(
        sm, defaults=env_defaults, exclude=[f for f in FLAG_FOR if f not in _MODEL_FLAGS]
    )
    sm.add_argument("--json", action="store_true", help="one JSON document on stdout")
    sm.add_argument("--prompt", default=None)
    sm.add_argument("--max-new-tokens", type=int, default=16)
    sm.add_argument("--strict", action="store_true", help="fail when the coherence score is low")
    sm.add_argument("--min-coherence", type=float, default=None)

    run = sub.add_parser("run", help="benchmark arms in one regime and write a report")
    add_verbosity_flags(run, top=False)
    add_bench_arguments(run, defaults=env_defaults)
    run.add_argument("--json", action="store_true", help="one JSON document on stdout")
    run.add_argument(
        "--markdown", action="store_true", help="print the markdown rendering to stderr"
    )
    run.add_argument(
        "--html",
        default=None,
        metavar="FILE",
        help="also write the run as one self-contained HTML page (arms, intervals, roofline "
        "plot, noise verdicts; opens offline in a browser)",
    )
    run.add_argument("--no-progress", action="store_true")
    run.add_argument(
        "--launched",
        action="store_true",
        help="run as one rank of the launcher that started this process (torchrun, srun, "
        "mpirun; detected from its environment without this flag too); rank 0 reports",
    )

    cmp = sub.add_parser("compare", help="ratios between reports")
    add_verbosity_flags(cmp, top=False)
    cmp.add_argument("reports", nargs="+")
    cmp.add_argument(
        "--force", action="store_true", help="compare across regimes or machines anyway"
    )
    cmp.add_argument(
        "--markdown", action="store_true", help="print markdown instead of a text table"
    )
    cmp.add_argument("--plot", default=None, help="write a bar chart PNG here")
    cmp.add_argument(
        "--allow-different",
        action="append",
        default=[],
        metavar="WHAT[,WHAT...]",
        help="two reports: compare although they differ in these (model, regime, shapes, "
        "device, dtype, versions)",
    )
    cmp.add_argument("--json", action="store_true")
    from .history_cli import add_history_parser

    add_history_parser(sub)
    return p


def _err(msg: str) -> None:
    # An error quotes strangers' text (a history's schema, a link's target, SQLite's
    # message): controls, bidi and invisible characters replaced, one line.
    print(f"pypto-bench: error: {visible(redact(msg))}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return EXIT.OK if exc.code == 0 else EXIT.USAGE
    verbosity = -1 if args.quiet else int(args.verbose or 0)
    # Undone on return: main() also runs in-process (tests, tools, notebooks).
    from .multi.lifecycle import sigterm_as_interrupt

    with (
        cli_logging(OWN_LOGGERS, verbosity, fmt="%(levelname)s %(name)s: %(message)s"),
        sigterm_as_interrupt(),  # SIGTERM unwinds like Ctrl-C: nothing left behind
    ):
        return _dispatch(args, args_list, verbosity)


def _dispatch(args: argparse.Namespace, args_list: list[str], verbosity: int) -> int:
    if args.command in ("smoke", "run"):
        from .environment import prepare_device_env

        for warning in prepare_device_env(args.device):
            log.warning("%s", warning)
    try:
        if args.command == "smoke":
            return _smoke(args)
        if args.command == "run":
            return _run(args, ["pypto-bench", *args_list])
        if args.command == "history":
            from .history_cli import run_history

            return run_history(args)
        return _compare(args)
    except BenchError as err:
        _err(str(err))
        return err.exit_code
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (lifecycle.Terminated): 143
        _err(str(err) or "interrupted")
        return int(getattr(err, "exit_code", 130))
    except Exception as err:  # one line, not a traceback, unless -v asks for it
        if verbosity >= 1:
            log.exception("unexpected error")
        _err(
            f"unexpected {type(err).__name__}: {' '.join(str(err).split())[:300]} "
            "(rerun with -v for the traceback and report it)"
        )
        return EXIT.FAILED


def _smoke(args: argparse.Namespace) -> int:
    from .smoke import DEFAULT_MIN_COHERENCE, DEFAULT_PROMPT, smoke
    from .vision import DEFAULT_IMAGE_PROMPT

    res = smoke(
        args.model_path,
        prompt=args.prompt or DEFAULT_PROMPT,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
        dtype=args.dtype,
        trust_remote_code=args.trust_remote_code,
        attn_implementation=args.attn_implementation,
        image=args.image,
        image_prompt=args.prompt or DEFAULT_IMAGE_PROMPT,
        strict=args.strict,
        min_coherence=args.min_coherence
        if args.min_coherence is not None
        else DEFAULT_MIN_COHERENCE,
    )
    if args.json:
        print(json.dumps(redact_obj(res.to_dict())))
    else:
        print(res.prompt + res.text)
    score = "-" if res.coherence is None else f"{res.coherence:.2f}"
    verdict = "PASS" if res.passed else f"FAIL ({res.stage})"
    if not args.quiet:
        print(f"smoke {verdict}: coherence {score} on {res.device}", file=sys.stderr)
        if res.vl:
            print(f"smoke: {_vl_line(res.vl)}", file=sys.stderr)
    if not res.passed:
        _err(res.reason or "smoke gate failed")
    return res.exit_code


def _vl_line(vl: dict[str, Any]) -> str:
    line = f"vision-language {vl.get('class')}: the text generation ran its language model"
    img = vl.get("image")
    if img:
        finite = "finite" if img.get("logits_finite") else "NOT finite"
        line += (
            f"; the image prompt ({img.get('width')}x{img.get('height')} {img.get('format')}, "
            f"{img.get('image_tokens')} image tokens of {img.get('prompt_tokens')}) ran the "
            f"whole model, logits {finite}"
        )
    return line


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
    from .args import bench_config_from_args

    # The recorded command line is redacted where the report is built and written.
    config = bench_config_from_args(args, command_line=command_line)
    if args.html:  # like --report-file: an unwritable page fails now, not after the run
        from .html_report import check_html_path

        check_html_path(args.html)
    if config.history:  # a refused or unwritable history stops the run before anything loads
        from .history import check_writable

        check_writable(config.history)
    from .multi.external import detect_launch, run_launched

    launch = detect_launch(required=args.launched)
    if launch is not None:  # run_launched logs which rank this is, and of what
        got = run_launched(config, launch)
        if got is None:  # not rank 0: its figures went to rank 0's report
            if not args.quiet:
                print(
                    f"pypto-bench: rank {launch.rank} done; rank 0 writes the report",
                    file=sys.stderr,
                )
            return EXIT.OK
        report = got
    elif config.nnodes > 1:
        got = _run_node(config)
        if got is None:  # this node's ranks are done; rank 0 ran on another node
            if not args.quiet:
                from .multi.launch import node_figures_path

                node = "" if config.node_rank is None else f" {config.node_rank}"
                own = ""
                if config.report_file:
                    kept = node_figures_path(config.report_file, config.node_rank)
                    own = f" (their own figures: {kept})" if kept.is_file() else ""
                print(
                    f"pypto-bench: node{node}: its ranks are done{own}; the node that ran "
                    "rank 0 writes the report",
                    file=sys.stderr,
                )
            return EXIT.OK
        report = got
    else:
        report = _run_here(config, args)
    return _after_run(config, args, report)


def _run_node(config: Any) -> Any:
    """One node of ``--nnodes N``: the report where rank 0 ran, else None."""
    from .loading import check_regime_fits_folder
    from .multi import run_node

    config.validate()
    check_regime_fits_folder(config.model_path, config.regime)
    return run_node(config, validated=True)


def _run_here(config: Any, args: argparse.Namespace) -> Any:
    """This process's own run (its own launcher for --nproc N)."""
    from .bench import run_bench
    from .errors import ReportWriteError

    progress = _Progress(not args.no_progress and not args.quiet)
    try:
        return run_bench(config, progress=progress)
    except ReportWriteError as err:
        # The results exist only in memory now: hand them out on stdout, never drop them.
        print(err.text, end="" if err.text.endswith("\n") else "\n")
        raise
    finally:
        progress.close()


def _after_run(config: Any, args: argparse.Namespace, report: Any) -> int:
    """Print the report, record it in the history, say where it was written."""
    from pathlib import Path

    from .report import format_table, report_to_markdown

    if not args.quiet:
        print(
            report_to_markdown(report) if args.markdown else format_table(report), file=sys.stderr
        )
    if args.json:
        print(report.to_json())
    code = EXIT.OK
    if config.report_file and report.written_to is not None:
        asked = Path(config.report_file).expanduser().resolve()
        if report.written_to.resolve() == asked:
            if not args.quiet:
                print(f"report written to {report.written_to}", file=sys.stderr)
        else:
            _err(
                f"could not write the report to {config.report_file}; it was saved to "
                f"{report.written_to} (copy it from there)"
            )
            code = EXIT.REPORT_FALLBACK
    if args.html:
        code = _write_page(args, report, code)
    if config.history:  # last: a history that fails now costs neither the report nor the page
        code = _record_history(config, args, report, code)
    if not report.ok:
        _err(f"arm(s) failed: {', '.join(report.failed_arm_causes)} (details in the report)")
        return EXIT.ARM_FAILED
    if report.reference_failed:
        from .report import reference_line

        rc = report.reference_check or {}
        line = reference_line(rc)
        if config.allow_inaccurate:
            _err(f"eager {line}: allowed by --allow-inaccurate")
        else:
            target = rc.get("target") or {}
            check = shlex.join([
                "pypto-precision", "check", "--model-path", str(config.model_path),
                "--device", str(target.get("device")), "--dtype", str(target.get("dtype")),
                "--reference-device", str(rc.get("device")), "--locate",
                "--out", "precision-check",
            ] + (["--trust-remote-code"] if config.trust_remote_code else []))  # fmt: skip
            _err(
                f"eager {line}: the target computes something else than the reference "
                f"device; look there with `{check}`; --allow-inaccurate exits 0"
            )
            return EXIT.INACCURATE
    wrong = report.numerics_failed
    if wrong and config.allow_inaccurate:
        _err(
            f"numerics FAIL allowed by --allow-inaccurate: {', '.join(wrong)} compute(s) "
            "something else than eager; their ratios are not comparable"
        )
    elif wrong:
        _err(
            f"numerics FAIL: {', '.join(wrong)} compute(s) something else than "
            f"{'the 1-rank eager run' if report.distributed else 'eager'} (the report says by "
            "how much); their ratios are not comparable. Find where with `pypto-precision "
            "check`; --allow-inaccurate exits 0"
        )
        return EXIT.INACCURATE
    return code


def _record_history(config: Any, args: argparse.Namespace, report: Any, code: int) -> int:
    """Record the run; a history that fails now (locked past the busy timeout, made
    read-only during the run) keeps the report and says how to add it later
    (``NOT_RECORDED``, 111: a script tells this from a failed run)."""
    from .history import record

    try:
        run_id = record(config.history, report)
    except HistoryError as err:
        kept = report.written_to
        if kept is None:
            _err(f"{err}; this run had no --report-file to keep it: pass one next time")
            return EXIT.NOT_RECORDED
        _err(
            f"{err}; the run is kept in {kept}: add it later with `pypto-bench history add "
            f"{kept} --db {config.history}`"
        )
        return EXIT.NOT_RECORDED
    if not args.quiet:
        print(f"recorded as run {run_id} in history {config.history}", file=sys.stderr)
    return code


def _write_page(args: argparse.Namespace, report: Any, code: int) -> int:
    """``--html FILE``: the page, handled like ``--report-file``: where asked, else a
    fallback path named on stderr (exit 45); nowhere at all raises ``ReportWriteError``."""
    from pathlib import Path

    from .html_report import write_html

    asked = Path(args.html).expanduser()
    written = write_html(report, asked, json_path=report.written_to)
    if written.resolve() == asked.resolve():
        if not args.quiet:
            print(f"page written to {written}", file=sys.stderr)
        return code
    _err(f"could not write the page to {args.html}; it was saved to {written} (copy it from there)")
    return EXIT.REPORT_FALLBACK


def _compare(args: argparse.Namespace) -> int:
    from .compare import compare, plot

    if len(args.reports) < 2:
        _err("compare needs at least two report files")
        return EXIT.USAGE
    if args.plot:
        from pathlib import Path

        from .report import check_report_path

        if Path(args.plot).suffix.lower() != ".png":
            _err(f"--plot {args.plot}: the chart is a PNG, name the file *.png")
            return EXIT.USAGE
        check_report_path(args.plot)
    from .verdicts import FINGERPRINT_FIELDS, verdicts

    allowed = [x.strip() for item in args.allow_different for x in item.split(",") if x.strip()]
    verdict = None
    if len(args.reports) == 2:  # B judged against A, from intervals
        from .report import load_report

        a, b = (load_report(r) for r in args.reports)
        verdict = verdicts(
            a,
            b,
            allow_different=FINGERPRINT_FIELDS if args.force else allowed,
            labels=(args.reports[0], args.reports[1]),
        )
    force = args.force or bool(verdict and verdict.differences)
    comp = compare(args.reports, force=force)
    for warning in comp.warnings:
        print(f"pypto-bench: warning: {redact(warning)}", file=sys.stderr)
    if args.json:
        doc = comp.to_dict()
        if verdict is not None:
            doc["verdicts"] = verdict.to_dict()
        print(json.dumps(doc))
    elif args.markdown:
        print(comp.to_markdown())
    else:
        print(comp.to_text())
    if verdict is not None and not args.json:
        print(verdict.to_text())
    if args.plot:
        plot(list(args.reports), args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return EXIT.OK


if __name__ == "__main__":
    raise SystemExit(main())
