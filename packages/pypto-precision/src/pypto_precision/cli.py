"""``pypto-precision``: compare two dumps here; ``dump`` and ``check`` come from pypto-bench.

Why the split: comparing needs two folders and torch, so it runs on any laptop; dumping
and checking load a model and run an arm, which pypto-bench owns. pypto-bench sits above
this package (its numerical gate uses this library), so it cannot be imported from here;
instead it registers its commands in the ``pypto_precision.commands`` entry-point group
and this one command finds them. Without pypto-bench, ``dump`` and ``check`` say what to
install (exit 3).

A command plug-in is an object with ``name``, ``help``, ``configure(parser)`` and
``run(args) -> int``; it raises :class:`pypto_precision.PrecisionError` subclasses for
failures this CLI turns into one line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from pypto_common import add_verbosity_flags, cli_logging, redact

from .codes import EXIT
from .compare import compare_dumps
from .errors import PrecisionError
from .load import read_dump
from .report import summary_line, write_reports
from .rule import DEFAULT_K, Rule

__all__ = ["COMMAND_GROUP", "k_type", "main"]

PROG = "pypto-precision"
#: Entry-point group through which pypto-bench adds ``dump`` and ``check``.
COMMAND_GROUP = "pypto_precision.commands"
_NEEDS_BENCH = ("dump", "check")
log = logging.getLogger("pypto_precision")


def _plugins() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for ep in metadata.entry_points(group=COMMAND_GROUP):
        try:
            command = ep.load()
        except Exception as err:  # a broken plug-in must not cost `compare`
            log.warning("command plug-in %s did not load: %s", ep.name, err)
            continue
        found[str(getattr(command, "name", ep.name))] = command
    return found


def k_type(text: str) -> float:
    """argparse type of ``--k``: a positive finite number (pypto-bench's ``check`` uses it)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number")
    return value


def _parser(plugins: dict[str, Any]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Is the port numerically right? Dump, compare, and name the first "
        "module that diverges.",
    )
    add_verbosity_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command")
    cmp = sub.add_parser(
        "compare",
        help="compare a target dump with a reference dump (ours or msprobe's)",
        description="Compare TARGET with REFERENCE (the trusted run), entry by entry; "
        "judge each against the noise floor (--floor: the target's dtype on the reference "
        "device) and name the first diverging module. Exit 0 pass, 100 diverged.",
    )
    cmp.add_argument("target", type=Path, help="the dump under test")
    cmp.add_argument("reference", type=Path, help="the trusted dump (e.g. CPU float64)")
    cmp.add_argument("--floor", type=Path, help="the target's dtype on the reference device")
    cmp.add_argument("--k", type=k_type, default=DEFAULT_K,
                     help=f"pass within k x the floor (default {DEFAULT_K:g})")  # fmt: skip
    cmp.add_argument("--out", type=Path, help="write compare.json/.md/.html into this folder")
    cmp.add_argument("--json", action="store_true", help="print compare.json on stdout")
    add_verbosity_flags(cmp, top=False)
    for name in _NEEDS_BENCH:
        if name in plugins:
            continue
        sub.add_parser(
            name,
            help=f"{name} (needs pypto-bench)",
            description=f"{name} loads a model and runs an arm, which pypto-bench does: "
            "pip install pypto-bench, and this command gains its flags.",
        )
    for name, command in sorted(plugins.items()):
        p = sub.add_parser(name, help=str(getattr(command, "help", name)))
        command.configure(p)
        add_verbosity_flags(p, top=False)
    return parser


def _compare(args: argparse.Namespace) -> int:
    target, reference = read_dump(args.target), read_dump(args.reference)
    floor = read_dump(args.floor) if args.floor else None
    result = compare_dumps(target, reference, floor=floor, rule=Rule(k=args.k))
    if args.out:
        paths = write_reports(result, args.out)
        log.info("wrote %s", ", ".join(str(p) for p in paths.values()))
    if args.json:
        print(json.dumps(result.to_dict(), indent=1, allow_nan=False))
    print(f"{PROG}: {summary_line(result)}", file=sys.stderr)
    return EXIT.OK if result.ok else EXIT.DIVERGED


def main(argv: Sequence[str] | None = None) -> int:
    plugins = _plugins()
    parser = _parser(plugins)
    try:
        args, extra = parser.parse_known_args(argv)
        missing = args.command in _NEEDS_BENCH and args.command not in plugins
        if extra and not missing:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # argparse printed its usage error (or --help)
        return int(exc.code or 0) and EXIT.USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT.USAGE
    if missing:
        print(
            f"{PROG}: error: {args.command} loads the model and runs the arm, which "
            "pypto-bench does: pip install pypto-bench (compare works without it)",
            file=sys.stderr,
        )
        return EXIT.ENVIRONMENT
    verbosity = -1 if args.quiet else int(args.verbose or 0)
    with cli_logging(["pypto_precision", "pypto_bench"], verbosity, fmt=f"{PROG}: %(message)s"):
        try:
            if args.command == "compare":
                return _compare(args)
            return int(plugins[args.command].run(args))
        except PrecisionError as err:
            print(f"{PROG}: error: {redact(' '.join(str(err).split()))}", file=sys.stderr)
            return err.exit_code
        except OSError as err:  # an output folder that cannot be written
            print(f"{PROG}: error: {redact(' '.join(str(err).split()))}", file=sys.stderr)
            return EXIT.FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
