"""``pypto-capture``: a thin command line over :func:`bisect_capture` and
:func:`explain_capture_error`.

``bisect --model-path DIR`` loads the model from a local folder (offline, never running
the folder's code) and names the first part of its decode step that fails to capture;
``explain CODE|MESSAGE`` prints the cause and fix of a capture error (an ACL code such as
107030, a CUDA code, or a pasted message; ``-`` reads it from stdin). stdout carries only
``--json``'s one document; people read stderr. Errors are one line with the exit code
of their class (``pypto_capture.EXIT``; docs/exit-codes.md), redacted like every pypto
tool's output.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pypto_common import add_verbosity_flags, cli_logging, redact, redact_obj

from . import __version__
from .backends import BACKENDS
from .bisect import BisectResult, bisect_capture
from .codes import EXIT
from .device import resolve_device
from .errors import (
    CacheDoesNotFitError,
    DeviceNotAvailableError,
    InvalidDeviceSpecError,
    PyptoCaptureError,
    UnsupportedModelError,
)
from .explain import CaptureExplanation, explain_capture_error
from .loading import (
    DTYPES,
    ModelFolderError,
    ModelLoadError,
    RemoteCodeRefusedError,
    load_local_model,
)

__all__ = ["PROG", "SUBCOMMANDS", "main"]

PROG = "pypto-capture"
SUBCOMMANDS = ("bisect", "explain")
#: The most of a pasted message ``explain -`` reads from stdin.
STDIN_LIMIT = 1 << 20


def _at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {value}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    codes = "\n".join(f"  {e.code:3}  {e.name}: {e.meaning}" for e in EXIT)
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Find where a model's decode step fails to capture, and explain capture errors.",
        epilog=f"exit codes:\n{codes}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{bisect,explain}")

    b = sub.add_parser(
        "bisect",
        help="capture each stage of a local model's decode step alone; name the first that fails",
        description=(
            "Load the model in --model-path (offline; the folder's own code is never run) and "
            "capture each stage of its decode step alone (embedding + final norm, attention, a "
            "recurrent mixer, a whole layer, the MoE block): the first that fails is named "
            "with its cause and fix. Exit 0: every stage captured; 90: a stage failed."
        ),
    )
    b.add_argument("--model-path", required=True, metavar="DIR", help="the model folder")
    b.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="capture backend (default auto: npugraph on NPU, fused on CUDA, compile on CPU)",
    )
    b.add_argument(
        "--device", default="auto", help="auto (default), cpu, cuda:N, npu:N or a card number"
    )
    b.add_argument(
        "--dtype", choices=DTYPES, default="auto", help="weights dtype (default: the checkpoint's)"
    )
    b.add_argument(
        "--attn-implementation",
        default=None,
        help="attention implementation to load with, e.g. eager or sdpa (default: the model's)",
    )
    b.add_argument(
        "--batch-size", "--batch", type=_at_least(1), default=1, help="decode batch (default 1)"
    )
    b.add_argument(
        "--max-cache-len", type=_at_least(1), default=16, help="static cache length (default 16)"
    )
    b.add_argument(
        "--layer-index",
        type=_at_least(0),
        default=0,
        help="the layer whose blocks are captured (default 0)",
    )
    b.add_argument(
        "--warmup", type=_at_least(0), default=1, help="eager calls before capture (default 1)"
    )
    b.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    add_verbosity_flags(b, top=True)

    e = sub.add_parser(
        "explain",
        help="the cause and fix of a capture error code or message",
        description=(
            "Explain a capture error: an ACL runtime code (107030), a CUDA code (900), or a "
            "pasted message ('-' reads it from stdin). Exit 0: recognised; 95: not in the table."
        ),
    )
    e.add_argument("error", nargs="+", metavar="CODE|MESSAGE", help="the code or message")
    e.add_argument(
        "--context",
        choices=("moe",),
        default=None,
        help="moe: the failing region is an MoE block (MoE-specific causes and fixes)",
    )
    e.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    add_verbosity_flags(e, top=True)
    return p


def _explanation_lines(ex: CaptureExplanation, indent: str = "") -> list[str]:
    head = f"[{ex.code}] {ex.name}" if ex.code else ex.name
    lines = [f"{indent}{head}", f"{indent}  cause: {ex.cause}", f"{indent}  fix:   {ex.fix}"]
    if ex.underlying:
        lines.insert(1, f"{indent}  error: {ex.underlying}")
    return lines


def _bisect_lines(result: BisectResult, model_path: str) -> list[str]:
    lines = [f"bisect of {model_path} with the {result.backend} backend:"]
    for stage in result.stages:
        verdict = {True: "ok", False: "FAILED", None: "-"}[stage.get("ok")]
        where = stage.get("module") or ""
        note = "" if stage.get("ok") is not False else f"  {stage.get('error') or ''}"
        lines.append(f"  {stage['stage']:11} {verdict:7} {where}{note}".rstrip())
        if stage.get("ok") is None and stage.get("error"):
            lines.append(f"  {'':11} {'':7} {stage['error']}")
    if result.failed_stage is None:
        lines.append("every stage captured")
    else:
        lines.append(f"first failing stage: {result.failed_stage}")
        if result.explanation is not None:
            lines += _explanation_lines(result.explanation, "  ")
    return lines


def _emit(args: argparse.Namespace, doc: dict[str, Any], lines: list[str]) -> None:
    if args.json:
        print(json.dumps(redact_obj(doc), indent=2, sort_keys=True))
    print(redact("\n".join(lines)), file=sys.stderr)


class _CliError(Exception):
    """One line for stderr and the exit code to return."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _cmd_bisect(args: argparse.Namespace) -> int:
    try:
        device = resolve_device(args.device)
    except InvalidDeviceSpecError as err:
        raise _CliError(str(err), EXIT.USAGE) from None
    except DeviceNotAvailableError as err:
        raise _CliError(str(err), EXIT.ENVIRONMENT) from None
    try:
        model = load_local_model(
            args.model_path, dtype=args.dtype, attn_implementation=args.attn_implementation
        )
    except RemoteCodeRefusedError as err:
        raise _CliError(str(err), EXIT.REMOTE_CODE) from None
    except ModelFolderError as err:
        raise _CliError(str(err), EXIT.MODEL_NOT_FOUND) from None
    except ModelLoadError as err:
        raise _CliError(str(err), EXIT.LOAD_FAILED) from None
    except ImportError as err:
        raise _CliError(
            f"{err.name or 'transformers'} is not installed: pip install 'pypto-capture[hf]'",
            EXIT.ENVIRONMENT,
        ) from None
    try:
        result = bisect_capture(
            model,
            backend=args.backend,
            device=device,
            batch_size=args.batch_size,
            max_cache_len=args.max_cache_len,
            layer_index=args.layer_index,
            warmup=args.warmup,
        )
    except UnsupportedModelError as err:  # also: no layer --layer-index
        raise _CliError(str(err), EXIT.UNSUPPORTED_MODEL) from None
    except CacheDoesNotFitError as err:  # --max-cache-len / --batch-size past free memory
        raise _CliError(f"{err} (--max-cache-len)", EXIT.USAGE) from None
    except PyptoCaptureError as err:  # before any stage: the prefill or the cache build
        raise _CliError(f"bisect could not run {args.model_path}: {err}", EXIT.FAILED) from None
    doc = {"model_path": str(args.model_path), **result.to_dict()}
    _emit(args, doc, _bisect_lines(result, str(args.model_path)))
    return EXIT.OK if result.failed_stage is None else EXIT.STAGE_FAILED


def _cmd_explain(args: argparse.Namespace) -> int:
    text = sys.stdin.read(STDIN_LIMIT) if args.error == ["-"] else " ".join(args.error)
    if not text.strip():
        raise _CliError("nothing to explain: pass an error code (107030) or message", EXIT.USAGE)
    ex = explain_capture_error(text.strip(), context=args.context)
    _emit(args, ex.to_dict(), _explanation_lines(ex))
    return EXIT.OK if ex.matched else EXIT.UNRECOGNISED


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse printed its usage error (or --help / --version)
        return int(exc.code or 0) and EXIT.USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT.USAGE
    verbosity = -1 if args.quiet else int(args.verbose or 0)
    with cli_logging(["pypto_capture"], verbosity, fmt=f"{PROG}: %(message)s"):
        handler = {"bisect": _cmd_bisect, "explain": _cmd_explain}[args.command]
        try:
            return handler(args)
        except _CliError as err:
            print(f"{PROG}: error: {redact(' '.join(str(err).split()))}", file=sys.stderr)
            return err.code
