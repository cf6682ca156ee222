"""``pypto-download``: a thin argparse layer over :func:`pypto_download.fetch`.

stdout carries only what a shell or a script consumes: one line
``export MODEL_PATH=<absolute path>`` (so ``eval "$(pypto-download ...)"`` works), or
with ``--json`` one JSON object. Progress bars and logs go to stderr. Every expected
failure is one line on stderr and a distinct exit code (see the README).
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from collections.abc import Sequence

from . import __version__
from .core import DownloadResult, fetch
from .errors import DownloadError

_LOG = logging.getLogger("pypto_download")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pypto-download",
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
        help="first retry delay in seconds, doubled each time (default: 1)",
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
        help="no progress bars, only warnings and errors on stderr",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="debug logs on stderr")
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
    for f in result.files:
        state = result.state.get(f.path, "missing")
        mark = {"complete": "have", "partial": "resume", "missing": "fetch"}.get(state, state)
        print(f"  {mark:<6} {_human_size(f.size):>10}  {f.path}", file=sys.stderr)
    print(
        f"  {len(result.files)} files, {_human_size(result.total_bytes)} in all, "
        f"{_human_size(result.bytes_to_fetch)} to fetch",
        file=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("pypto-download: %(levelname)s: %(message)s"))
    level = logging.DEBUG if args.verbose else (logging.WARNING if args.quiet else logging.INFO)
    _LOG.addHandler(handler)
    _LOG.setLevel(level)
    _LOG.propagate = False
    if args.verbose:
        logging.getLogger("huggingface_hub").setLevel(logging.DEBUG)
    try:
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
                dry_run=args.dry_run,
                progress=not (args.quiet or (args.json and not sys.stderr.isatty())),
            )
        except DownloadError as err:
            return _fail(err.message, err.exit_code, err.to_dict(), args.json, secret=args.token)
        except KeyboardInterrupt:
            return _fail(
                "interrupted: re-run the same command to resume",
                130,
                {"kind": "interrupted"},
                args.json,
            )
        except Exception as err:  # unexpected: still one line, never a traceback
            _LOG.debug("unexpected error", exc_info=True)
            msg = f"unexpected {type(err).__name__}: {' '.join(str(err).split())} (re-run with -v for details)"
            return _fail(msg, 1, {"kind": "failed"}, args.json, secret=args.token)
        if args.dry_run and not args.quiet:
            _print_plan(result)
        if args.json:
            print(json.dumps(dict(result.to_dict(), ok=True)))
        elif not args.dry_run:
            print(f"export MODEL_PATH={shlex.quote(str(result.path))}")
            if not args.quiet:
                _LOG.info(
                    "%s@%s (%s) ready in %s: %d file(s) fetched, %d already there",
                    result.repo_id,
                    result.revision,
                    (result.commit or "")[:12],
                    result.path,
                    len(result.fetched),
                    len(result.files) - len(result.fetched),
                )
        return 0
    finally:
        _LOG.removeHandler(handler)


def _fail(message: str, code: int, info: dict, as_json: bool, secret: str | None = None) -> int:
    if secret:  # belt and braces: no message we build contains it, but hub text could
        message = message.replace(secret, "***")
    print(f"pypto-download: error: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"ok": False, "error": dict(info, message=message, exit_code=code)}))
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
