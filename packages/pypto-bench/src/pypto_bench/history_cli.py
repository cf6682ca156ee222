"""``pypto-bench history list | show | check | add | plot``: the CLI side of :mod:`.history`.

Exit codes: 0 ok; 2 (``USAGE``) a refused database or bad flags; 49 (``REGRESSION``)
``check`` found a regression, so a CI job can gate on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pypto_common import add_verbosity_flags, redact
from pypto_common.visible import visible

from .errors import EXIT

__all__ = ["LIST_LAST", "add_history_parser", "run_history"]

#: How many of the newest runs ``history list`` shows unless ``--last`` says otherwise.
LIST_LAST = 100


def add_history_parser(sub: Any) -> None:
    """Add ``history`` with its five actions to the subparsers ``sub``."""
    hist = sub.add_parser("history", help="the results history (--history DB): list, check")
    add_verbosity_flags(hist, top=False)
    actions = hist.add_subparsers(dest="history_command", required=True)

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        a: argparse.ArgumentParser = actions.add_parser(name, help=help_text)
        add_verbosity_flags(a, top=False)
        a.add_argument("--db", required=True, metavar="DB", help="the history file")
        return a

    ls = action("list", f"the newest {LIST_LAST} recorded runs (oldest first; --last N)")
    ls.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ls.add_argument(
        "--last",
        type=_count,
        default=LIST_LAST,
        metavar="N",
        help=f"list the newest N runs (default {LIST_LAST}; 0 lists every run)",
    )
    sh = action("show", "one run: fingerprint, arms, the stored report")
    sh.add_argument("run_id", type=_run_id, metavar="ID")
    sh.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ck = action(
        "check", f"judge the newest run of each group; exit {EXIT.REGRESSION} on a regression"
    )
    ck.add_argument(
        "--min-runs",
        type=int,
        default=3,
        help="earlier runs a group needs to be judged (default: 3)",
    )
    ck.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="smallest band, as a share of the baseline (default: 0.05)",
    )
    ck.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ad = action("add", "record a report written earlier (a run whose history write failed)")
    ad.add_argument("report", metavar="REPORT.json", help="a pypto-bench run's report")
    pl = action("plot", "PNG of a ratio (or tok/s) over time")
    pl.add_argument("--out", required=True, metavar="FILE", help="the PNG to write")
    pl.add_argument("--measure", default="x eager", choices=("x eager", "tok/s"))
    pl.add_argument("--arm", default=None, help="only this arm (default: every arm)")


#: The most characters one stored value prints (a 20 MB arm name printed 42 MB).
_MAX_CELL = 200


def _whole_number(text: str, what: str, low: int, high: int, span: str, hint: str = "") -> int:
    """``text`` as a whole number in ``low..high``; argparse's one-line error otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{what} must be a whole number, got {text[:40]!r}"
        ) from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{what} must be {span}, got {text[:40]}{hint}")
    return value


def _count(text: str) -> int:
    """``--last N``: 0 (every run) .. 2**31."""
    return _whole_number(text, "--last", 0, 2**31, "0 (every run) .. 2**31")


def _run_id(text: str) -> int:
    """A run id as SQLite stores one: 1 .. 2**63-1 (a larger number cannot be asked for)."""
    return _whole_number(
        text,
        "run id",
        1,
        2**63 - 1,
        "between 1 and 2**63-1",
        ": `pypto-bench history list --db DB` lists the ids",
    )


def _t(value: Any, limit: int = _MAX_CELL) -> str:
    """Stored text made safe for a terminal: controls replaced, clipped with its length."""
    text = visible(str(value))
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text)} characters)"


def _fmt(v: Any, spec: str = ".3g") -> str:
    return "-" if v is None else format(v, spec)


def _table(rows: list[list[str]]) -> str:
    rows = [[_t(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def run_history(args: argparse.Namespace) -> int:
    """Run one ``history`` action; errors propagate as ``BenchError`` (one line upstream)."""
    from . import history

    if args.history_command == "add":
        data = history.read_report_file(args.report)
        run_id = history.record(args.db, data)
        print(f"recorded {args.report} as run {run_id} in history {args.db}", file=sys.stderr)
        return EXIT.OK
    if args.history_command == "list":
        runs = history.list_runs(args.db, last=args.last or None)
        if args.last and len(runs) == args.last:
            total = history.count_runs(args.db)
            if total > len(runs):
                print(
                    f"the newest {len(runs)} of {total} runs; --last 0 lists every run",
                    file=sys.stderr,
                )
        if args.json:
            print(json.dumps(runs))
            return EXIT.OK
        rows = [["id", "created", "model", "regime", "device", "dtype", "batch", "arms (tok/s)"]]
        for r in runs:
            arms = ", ".join(f"{a['arm']} {_fmt(a['tok_s_median'])}" for a in r["arms"])
            rows.append(
                [
                    str(r["id"]),
                    str(r["created_at"]),
                    str(r["model"])[:12],
                    r["regime"],
                    r["device"],
                    str(r["dtype"]),
                    str(r["batch"]),
                    arms,
                ]
            )
        print(_table(rows))
        return EXIT.OK
    if args.history_command == "show":
        run = history.show_run(args.db, args.run_id)
        if args.json:
            print(json.dumps(run))
            return EXIT.OK
        for k, v in run.items():
            if k not in ("report", "arms"):
                print(f"{_t(k)}: {_t(v)}")
        for a in run["arms"]:
            print(
                f"arm {_t(a['arm'])}: tok/s {_fmt(a['tok_s_median'])} [{_fmt(a['tok_s_low'])}, "
                f"{_fmt(a['tok_s_high'])}]  x eager {_fmt(a['x_eager_median'])} "
                f"[{_fmt(a['x_eager_low'])}, {_fmt(a['x_eager_high'])}]  ({_t(a['method'])})"
            )
        return EXIT.OK
    if args.history_command == "check":
        result = history.check(args.db, min_runs=args.min_runs, tolerance=args.tolerance)
        if args.json:
            print(json.dumps(result.to_dict()))
        print(f"rule: {result.rule}", file=sys.stderr)
        for g in result.groups:
            parts = "; ".join(
                f"{m['measure']} {m['verdict']}: {_fmt(m['newest']['median'])} "
                f"[{_fmt(m['newest']['low'])}, {_fmt(m['newest']['high'])}] vs "
                f"{_fmt(m['baseline'])} +- {_fmt(m['band'])}"
                for m in g["measures"]
            )
            print(
                redact(
                    f"{g['verdict'].upper()}: run {g['run_id']} {_t(g['arm'])} {_t(g['regime'])} "
                    f"{_t(g['device'])} ({g['earlier_runs']} earlier){': ' + parts if parts else ''}"
                ),
                file=sys.stderr,
            )
        return result.exit_code
    out = history.plot_history(args.db, args.out, measure=args.measure, arm=args.arm)
    print(f"plot written to {out}", file=sys.stderr)
    return EXIT.OK
