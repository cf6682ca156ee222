"""``pypto-tune tile-search KERNEL --shape rows=16,hidden=2048``: the CLI of :mod:`.tiles`.

Progress and the table go to stderr (humans); ``--json`` puts the one result
document on stdout. Errors are one line and the error's exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pypto_common import add_verbosity_flags, redact, redact_obj

from .errors import EXIT, BadInputError, TuneError
from .tiles import DEFAULT_BUDGET, TileSearchResult, tile_search

__all__ = [
    "DTYPES",
    "format_table",
    "parse_shape",
    "register",
    "run",
]

DTYPES = ("bf16", "fp16", "fp32")
_EPILOG = """\
examples:
  pypto-tune tile-search swiglu_mlp --shape rows=16,hidden=2048,inter=11008
  pypto-tune tile-search rms_norm --shape rows=1024,hidden=2048 --dtype fp32 --json

Kernels come from installed kernel packages (pypto.kernels plug-ins with tunables());
an unknown KERNEL lists them. Exit codes: 0 ok, 2 bad input, 3 PyPTO/g++ or no tunable
kernel installed, 83 no candidate ran."""


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``tile-search`` subcommand to pypto-tune's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "tile-search",
        help="search a PyPTO kernel's tile shapes over the PyPTO cost model",
        description=(
            "Search tile shapes of a PyPTO kernel over the PyPTO cost model (SIM mode,"
            " simulated cycles; a relative signal, not an NPU time)."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kernel", metavar="KERNEL", help="tunable kernel name (e.g. swiglu_mlp)")
    p.add_argument(
        "--shape",
        required=True,
        metavar="NAME=N,...",
        help="the kernel's shape, e.g. rows=16,hidden=2048[,inter=11008]",
    )
    p.add_argument("--dtype", default="bf16", choices=DTYPES, help="io dtype (default bf16)")
    p.add_argument(
        "--budget",
        type=int,
        default=None,
        metavar="N",
        help=f"candidates to simulate at most, the default included (default {DEFAULT_BUDGET})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="stop one candidate after S seconds (default: 10x the default tiling's time, >= 60)",
    )
    p.add_argument("--json", action="store_true", help="the result as one JSON document on stdout")
    # Accept -v/-q after the subcommand too (the top-level parser owns their defaults).
    add_verbosity_flags(p, top=False)
    return p


def parse_shape(text: str) -> dict[str, int]:
    """``rows=16,hidden=2048`` -> ``{"rows": 16, "hidden": 2048}``; BadInputError otherwise."""
    example = "e.g. --shape rows=16,hidden=2048"
    out: dict[str, int] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise BadInputError(f"--shape {text!r}: each item must be NAME=N ({example})")
        if name in out:
            raise BadInputError(f"--shape {text!r}: {name} given twice ({example})")
        try:
            n = int(value)
        except ValueError:
            raise BadInputError(
                f"--shape {text!r}: {name}={value} is not an integer ({example})"
            ) from None
        out[name] = n
    return out


def _progress(done: int, total: int, entry: dict[str, Any]) -> None:
    what = f"{entry['sim_us']:.1f} us" if entry["ok"] else f"failed: {entry['error']}"
    mark = " (default)" if entry["is_default"] else ""
    print(f"[{done}/{total}] {entry['label']}{mark}: {what}", file=sys.stderr, flush=True)


def format_table(result: TileSearchResult, top: int = 10) -> str:
    """The human summary: best first, the default marked, failures counted."""
    ok = sorted((e for e in result.candidates if e["ok"]), key=lambda e: e["sim_us"])
    failed = [e for e in result.candidates if not e["ok"]]
    shape = ",".join(f"{k}={v}" for k, v in result.shape.items())
    lines = [
        f"tile-search {result.kernel} {shape} {result.dtype}: {result.method},"
        f" {len(result.candidates)} of {result.space_size} candidates simulated"
        f" in {result.wall_s:.1f} s",
        f"{'rank':>4}  {'sim us':>10}  {'vs default':>10}  tiles",
    ]
    d = result.default_us
    shown = ok[:top]
    if result.default and result.default["ok"] and result.default not in shown:
        shown.append(result.default)
    for e in shown:
        rank = ok.index(e) + 1
        ratio = f"{d / e['sim_us']:.2f}x" if d else "-"
        mark = "  (default)" if e["is_default"] else ""
        lines.append(f"{rank:>4}  {e['sim_us']:>10.1f}  {ratio:>10}  {e['label']}{mark}")
    if failed:
        lines.append(f"{len(failed)} candidate(s) did not run, e.g.: {failed[0]['error']}")
    if result.best is not None:
        sp = f"{result.speedup:.2f}x vs the default" if result.speedup else "no default time"
        lines.append(f"best: {result.best['label']} ({result.best_us:.1f} us, {sp})")
    lines.extend(f"warning: {w}" for w in result.warnings)
    lines.append(f"note: {result.note}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Handle ``tile-search``: returns the exit code (never raises a TuneError)."""
    try:
        shape = parse_shape(args.shape)
        result = tile_search(
            args.kernel,
            shape,
            dtype=args.dtype,
            budget=args.budget,
            progress=None if getattr(args, "quiet", False) else _progress,
            timeout_s=args.timeout,
        )
    except TuneError as err:
        print(f"pypto-tune: error: {redact(str(err))}", file=sys.stderr)
        return err.exit_code
    if args.json:
        print(json.dumps(redact_obj(result.to_dict()), indent=2))
    else:
        print(redact(format_table(result)), file=sys.stderr)
    return EXIT.OK
