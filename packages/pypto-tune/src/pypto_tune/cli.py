"""``pypto-tune profile | advise | compare | tile-search``: a thin layer over the library.

Errors become one line on stderr and an exit code (README "Exit codes"); humans read
stderr, ``--json`` puts one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

from pypto_common import add_verbosity_flags, cli_logging, redact, redact_obj

from .errors import EXIT, BadInputError, OutputWriteError, TuneError

__all__ = [
    "OWN_LOGGERS",
    "main",
]

log = logging.getLogger("pypto_tune")

OWN_LOGGERS = ("pypto_tune", "pypto_bench", "pypto_capture")
# Bench flags that make no sense for one profiled arm (pypto-tune has its own).
_EXCLUDED_BENCH_FLAGS = [
    "arms",
    "warmup",
    "iters",
    "report_file",
    "measure_bandwidth",
    "history",
    "reference",  # a check of the numbers, not of the time: pypto-bench run --reference
]


def _thresholds(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change a detector threshold (repeatable; names in the README)",
    )


def _parser() -> argparse.ArgumentParser:
    from pypto_bench import ARMS, add_bench_arguments

    from . import cli_tiles

    p = argparse.ArgumentParser(prog="pypto-tune", description=__doc__.splitlines()[0])
    add_verbosity_flags(p, top=True)
    sub = p.add_subparsers(dest="command", required=True)

    pr = sub.add_parser("profile", help="profile the step pypto-bench measures, diagnose, advise")
    add_verbosity_flags(pr, top=False)
    add_bench_arguments(
        pr, defaults={"model_path": os.environ.get("MODEL_PATH")}, exclude=_EXCLUDED_BENCH_FLAGS
    )
    pr.add_argument("--arm", default="eager", choices=ARMS, help="the arm whose step is profiled")
    pr.add_argument(
        "--level",
        default="light",
        choices=("light", "detail"),
        help="light: operator timings; detail: + shapes, memory, stacks, FLOPs",
    )
    pr.add_argument("--iters", type=int, default=3, help="profiled iterations (default 3)")
    pr.add_argument("--warmup", type=int, default=1, help="unprofiled iterations first (default 1)")
    pr.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="write profile.json, profile.md, report.html (the diagnosis as one page), "
        "trace.json (Perfetto), torch/trace.json (torch.profiler's own, ProfilerStep#N "
        "marks: point HTA at DIR/torch) and breakdown.png here",
    )
    pr.add_argument(
        "--no-peaks",
        action="store_true",
        help="skip the matmul/bandwidth probes (and the detectors that need them)",
    )
    pr.add_argument("--json", action="store_true", help="the profile JSON on stdout")
    _thresholds(pr)

    ad = sub.add_parser("advise", help="diagnose a saved profile (other thresholds) and advise")
    add_verbosity_flags(ad, top=False)
    ad.add_argument("profile", help="profile.json from `pypto-tune profile`")
    ad.add_argument("--json", action="store_true")
    ad.add_argument(
        "--write",
        action="store_true",
        help="store the new diagnosis in the file (and in report.html beside it)",
    )
    _thresholds(ad)

    cm = sub.add_parser("compare", help="diff two profiles; check the baseline's predictions")
    add_verbosity_flags(cm, top=False)
    cm.add_argument("base")
    cm.add_argument("opt")
    cm.add_argument(
        "--applied",
        action="append",
        default=[],
        metavar="ID",
        help="recommendation id(s) applied (default: those the OPT settings satisfy)",
    )
    cm.add_argument(
        "--plot",
        metavar="PNG",
        help="also draw both profiles' time by block side by side (needs matplotlib)",
    )
    cm.add_argument(
        "--tolerance",
        type=float,
        default=2.0,
        help="a prediction within this factor came true (default 2)",
    )
    cm.add_argument(
        "--allow-different",
        action="store_true",
        help="compare two model classes holding the same number of parameters (the same "
        "weights pinned to other modeling code: fused ops, another KV layout)",
    )
    cm.add_argument("--json", action="store_true")

    cli_tiles.register(sub)
    return p


def _err(msg: str) -> None:
    print(f"pypto-tune: error: {redact(msg)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(args_list)
    except SystemExit as exc:
        return EXIT.OK if exc.code == 0 else EXIT.USAGE
    verbosity = -1 if args.quiet else int(args.verbose or 0)
    with cli_logging(OWN_LOGGERS, verbosity, fmt="%(levelname)s %(name)s: %(message)s"):
        return _dispatch(args, args_list, verbosity)


def _dispatch(args: argparse.Namespace, args_list: list[str], verbosity: int) -> int:
    try:
        if args.command == "profile":
            return _profile(args, ["pypto-tune", *args_list])
        if args.command == "advise":
            return _advise(args)
        if args.command == "compare":
            return _compare(args)
        from . import cli_tiles

        return cli_tiles.run(args)
    except TuneError as err:
        _err(str(err))
        return err.exit_code
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except Exception as err:
        if verbosity >= 1:
            log.exception("unexpected error")
        _err(
            f"unexpected {type(err).__name__}: {' '.join(str(err).split())[:300]} "
            "(rerun with -v for the traceback and report it)"
        )
        return EXIT.FAILED


def _parse_thresholds(pairs: list[str]) -> Any:
    from .detect import Thresholds

    try:
        return Thresholds.from_pairs(pairs)
    except ValueError as err:
        raise BadInputError(str(err)) from None


def _check_out(out: str | None) -> Path | None:
    if out is None:
        return None
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise BadInputError(f"--out {out}: exists and is not a folder; name a folder")
    parent = path if path.exists() else path.parent
    if not parent.exists() or not os.access(parent, os.W_OK):
        raise BadInputError(
            f"--out {out}: {parent} is missing or not writable; name a writable folder"
        )
    return path


def _profile(args: argparse.Namespace, command_line: list[str]) -> int:
    from pypto_bench import bench_config_from_args

    from .advise import advise
    from .model import profile_model
    from .outputs import to_markdown, write_outputs

    thresholds = _parse_thresholds(args.threshold)
    out = _check_out(args.out)
    config = bench_config_from_args(args, arms=(args.arm,), command_line=command_line)
    if config.batches:
        raise BadInputError(
            f"--batch {','.join(map(str, config.batches))}: a profile is of one batch size; "
            "profile each batch apart (--batch N)"
        )

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"pypto-tune: {msg}", file=sys.stderr)

    if config.nproc > 1 or config.nnodes > 1:
        return _profile_ranks(args, config, out)
    prof = profile_model(
        config,
        arm=args.arm,
        level=args.level,
        iters=args.iters,
        warmup=args.warmup,
        peaks=not args.no_peaks,
        output_dir=str(out / "npu")
        if out is not None and config.device.startswith("npu")
        else None,
        progress=progress,
    )
    prof.meta["command_line"] = redact_obj(command_line)
    advise(prof, thresholds)
    if out is not None:
        written = write_outputs(prof, out)
        if not args.quiet:
            print(f"pypto-tune: wrote {', '.join(written.values())}", file=sys.stderr)
    if not args.quiet:
        print(to_markdown(prof), file=sys.stderr)
    if args.json:
        print(json.dumps(redact_obj(prof.to_dict()), default=str))
    return EXIT.OK


def _profile_ranks(args: argparse.Namespace, config: Any, out: Path | None) -> int:
    """``--nproc N`` / ``--nnodes N``: every rank's profiled step kept under ``--out``."""
    from .ranks import profile_ranks, ranks_markdown

    world = f"--nproc {config.nproc}" if config.nnodes == 1 else f"--nnodes {config.nnodes}"
    if out is None:
        raise BadInputError(f"{world} keeps one profile per rank: name a folder with --out DIR")
    if args.level != "light" or args.threshold:
        flag = "--level detail" if args.level != "light" else "--threshold"
        raise BadInputError(
            f"{flag} applies to a one-process profile; {world} profiles each rank's step "
            f"for its collectives: drop {flag}, or profile without {world}"
        )
    from dataclasses import replace

    # The run's timed iterations give each rank's step; one more, profiled, its collectives.
    config = replace(config, iters=args.iters, warmup=args.warmup)
    got = profile_ranks(config, arm=args.arm, out=out)
    if got.summary is None:
        if not args.quiet:
            print(
                f"pypto-tune: this node's ranks kept their profiles in {got.folder}; the node "
                "that ran rank 0 writes the summary",
                file=sys.stderr,
            )
        return EXIT.OK
    if not args.quiet:
        print(f"pypto-tune: wrote {', '.join(got.written.values())}", file=sys.stderr)
        print(ranks_markdown(got.summary), file=sys.stderr)
    if args.json:
        print(json.dumps(redact_obj(got.summary), default=str))
    return EXIT.OK


def _advise(args: argparse.Namespace) -> int:
    from .advise import advise
    from .html_report import PAGE_NAME
    from .outputs import load_profile, to_markdown, write_page, write_profile

    thresholds = _parse_thresholds(args.threshold)
    prof = load_profile(args.profile)
    advise(prof, thresholds)
    if args.write:
        written = write_profile(prof, args.profile)
        # In a folder `pypto-tune profile --out` wrote, profile.md and the page beside it
        # show the new diagnosis too (a trace there is linked); elsewhere only the file.
        folder = written.parent
        if (folder / "profile.md").is_file() or (folder / PAGE_NAME).is_file():
            from pypto_common import atomic_write_text

            try:
                atomic_write_text(folder / "profile.md", to_markdown(prof))
            except OSError as err:
                raise OutputWriteError(
                    f"cannot write {folder / 'profile.md'} ({err.strerror or err}): free "
                    "space or make the folder writable"
                ) from None
            write_page(
                prof,
                folder / PAGE_NAME,
                trace_href="trace.json" if (folder / "trace.json").is_file() else None,
                profile_href=written.name,
            )
    if args.json:
        print(
            json.dumps(
                redact_obj({"findings": prof.findings, "recommendations": prof.recommendations}),
                default=str,
            )
        )
    elif not args.quiet:
        print(to_markdown(prof), file=sys.stderr)
    return EXIT.OK


def _compare(args: argparse.Namespace) -> int:
    from .compare import compare_profiles, comparison_markdown
    from .outputs import load_profile

    if not math.isfinite(args.tolerance) or args.tolerance < 1.0:
        raise BadInputError(
            f"--tolerance must be a finite factor >= 1 (e.g. 2), got {args.tolerance}"
        )
    result = compare_profiles(
        load_profile(args.base),
        load_profile(args.opt),
        applied=args.applied,
        tolerance=args.tolerance,
        allow_different=args.allow_different,
    )
    if args.plot:
        from .outputs import plot_comparison

        result["plot"] = str(plot_comparison(result, args.plot))
    if args.json:
        print(json.dumps(result, default=str))
    elif not args.quiet:
        print(comparison_markdown(result), file=sys.stderr)
    return EXIT.OK


if __name__ == "__main__":
    raise SystemExit(main())
