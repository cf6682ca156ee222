"""``pypto-download``: a thin argparse layer over :func:`pypto_download.fetch`.

stdout carries only what a shell or a script consumes: one line
``export MODEL_PATH=<absolute path>`` (so ``eval "$(pypto-download ...)"`` works), or
with ``--json`` one JSON object. Progress bars and logs go to stderr. Every expected
failure is one line on stderr and a distinct exit code (see the README), and nothing
printed carries a token or endpoint credentials (``pypto_common.redact``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from pypto_common import cli_logging, export_line, known_secrets, redact, redact_obj

from . import __version__
from .core import DownloadResult, fetch
from .errors import EXIT, INTERRUPTED_EXIT, DownloadError
from .inputs import DEFAULT_MAX_RETRY_WAIT, DEFAULT_READ_TIMEOUT, endpoint_secrets

__all__ = ["main"]

_LOG = logging.getLogger("pypto_download")
_PROG = "pypto-download"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit USAGE), like every other error."""

    def error(self, message: str) -> NoReturn:
        print(f"{_PROG}: error: {message} (see {_PROG} --help)", file=sys.stderr)
        raise SystemExit(EXIT.USAGE)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=_PROG,
        description="Download a HuggingFace model repository into a folder (resumable, verified, retried).",
        epilog='Typical use: eval "$(pypto-download --model-id ORG/REPO --output-dir models/REPO)"',
    )
    p.add_argument("--model-id", required=True, help="ORG/REPO on the hub")
    p.add_argument("--output-dir", required=True, help="destination folder (created if missing)")
    p.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    p.add_argument("--token", default=None, help="hub token (default: $HF_TOKEN); never printed")
    p.add_argument(
        "--allow-pattern",
        action="append",
        default=None,
        metavar="P",
        help="only files matching P (repeatable)",
    )
    p.add_argument(
        "--ignore-pattern",
        action="append",
        default=None,
        metavar="P",
        help="skip files matching P (repeatable)",
    )
    p.add_argument(
        "--endpoint",
        default=None,
        help="hub or mirror URL (default: $HF_ENDPOINT, else https://huggingface.co)",
    )
    p.add_argument(
        "--max-workers", type=int, default=8, help="files downloaded in parallel (default: 8)"
    )
    p.add_argument(
        "--retries",
        type=int,
        default=3,
        help="retries per request on transient errors (default: 3)",
    )
    p.add_argument(
        "--backoff",
        type=float,
        default=1.0,
        help="first retry delay in seconds, doubled each time, at most 30 (default: 1)",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=DEFAULT_READ_TIMEOUT,
        metavar="S",
        help=f"a request that receives nothing for S seconds fails and is retried (default: {DEFAULT_READ_TIMEOUT:g})",
    )
    p.add_argument(
        "--max-retry-wait",
        type=float,
        default=DEFAULT_MAX_RETRY_WAIT,
        metavar="S",
        help=f"the longest wait a server's Retry-After gets (default: {DEFAULT_MAX_RETRY_WAIT:g})",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list what would be fetched, with sizes; change nothing",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object on stdout instead of the export line",
    )
    p.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress bars and no logs: only errors on stderr",
    )
    p.add_argument(
        "--verbose",
        "-v",
        action="count",
        default=0,
        help="-v: other libraries' logs and full multi-line messages; -vv: debug",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def _human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def _print_plan(result: DownloadResult) -> None:
    print(
        f"{result.repo_id}@{result.revision} (commit {result.commit}) -> {result.path}",
        file=sys.stderr,
    )
    marks = {"complete": "have", "partial": "resume", "missing": "fetch", "patched": "pinned"}
    for f in result.files:
        state = result.state.get(f.path, "missing")
        print(
            f"  {marks.get(state, state):<6} {_human_size(f.size):>10}  {f.path}", file=sys.stderr
        )
    for s in result.skipped:
        print(f"  {'skip':<6} {'':>10}  {s.path}", file=sys.stderr)
    print(
        f"  {len(result.files)} files, {_human_size(result.total_bytes)} in all, "
        f"{_human_size(result.bytes_to_fetch)} to fetch",
        file=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    endpoint = args.endpoint or os.environ.get("HF_ENDPOINT") or ""
    secrets = known_secrets([args.token, *endpoint_secrets(endpoint)])
    verbosity = -1 if args.quiet else args.verbose
    # cli_logging routes huggingface_hub's own handler (1.x/2.x add one and propagate too)
    # through ours, redacts tracebacks, and undoes it all on return.
    with cli_logging(
        ["pypto_download"], verbosity, secrets=secrets, fmt=f"{_PROG}: %(levelname)s: %(message)s"
    ):
        try:
            result = fetch(
                args.model_id,
                args.output_dir,
                revision=args.revision,
                token=args.token,
                allow_patterns=args.allow_pattern,
                ignore_patterns=args.ignore_pattern,
                endpoint=args.endpoint,
                max_workers=args.max_workers,
                retries=args.retries,
                backoff=args.backoff,
                read_timeout=args.read_timeout,
                max_retry_wait=args.max_retry_wait,
                dry_run=args.dry_run,
                progress=not (args.quiet or (args.json and not sys.stderr.isatty())),
            )
        except DownloadError as err:
            if err.exit_code == EXIT.FAILED and err.__cause__ is not None:
                cause = err.__cause__
                trace = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
                _LOG.debug("%s", redact(trace, secrets))
            return _fail(err.message, err.exit_code, err.to_dict(), args.json, secrets)
        except KeyboardInterrupt:
            return _fail(
                "interrupted: re-run the same command to resume",
                INTERRUPTED_EXIT,
                {"kind": "interrupted"},
                args.json,
                secrets,
            )
        except Exception as err:  # unexpected: still one line, never a traceback
            _LOG.debug("%s", redact(traceback.format_exc(), secrets))
            msg = f"unexpected {type(err).__name__}: {' '.join(str(err).split())} (re-run with -vv for details)"
            return _fail(msg, EXIT.FAILED, {"kind": "failed"}, args.json, secrets)
        if args.dry_run and not args.quiet:
            _print_plan(result)
        if args.json:
            print(json.dumps(redact_obj(dict(result.to_dict(), ok=True), secrets)))
        elif not args.dry_run:
            print(export_line("MODEL_PATH", result.path))
            extra = ""
            if result.skipped:
                extra += f", {len(result.skipped)} skipped (names the pypto tools own)"
            if result.patched:
                extra += f", {len(result.patched)} kept as pypto-patch pinned them"
            _LOG.info(
                "%s@%s (%s) ready in %s: %d file(s) fetched, %d already there%s",
                result.repo_id,
                result.revision,
                (result.commit or "")[:12],
                result.path,
                len(result.fetched),
                len(result.files) - len(result.fetched) - len(result.patched),
                extra,
            )
        return EXIT.OK


def _fail(
    message: str, code: int, info: dict[str, Any], as_json: bool, secrets: Sequence[str]
) -> int:
    message = redact(message, secrets)
    print(f"{_PROG}: error: {message}", file=sys.stderr)
    if as_json:
        doc = {"ok": False, "error": dict(info, message=message, exit_code=code)}
        print(json.dumps(redact_obj(doc, secrets)))
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
