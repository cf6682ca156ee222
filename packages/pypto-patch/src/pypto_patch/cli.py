"""``pypto-patch``: a thin argparse layer over the library.

stdout carries only what a shell or a script consumes (``export MODEL_PATH=...`` or,
with ``--json``, one JSON document); people read stderr. Errors are one line with the
exit code of their class (``pypto_patch.EXIT``), redacted like every pypto tool's output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from pypto_common import cli_logging, export_line, redact, redact_obj

from . import __version__
from .core import apply, restore, status
from .errors import EXIT, BadInputError, PatchError
from .presets import discover_presets
from .verify import verify_pinned

__all__ = ["SUBCOMMANDS", "main"]

SUBCOMMANDS = ("apply", "restore", "status", "verify", "list")


def _kv(flag: str, text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"{flag} expects KEY=VALUE, got {text!r}")
    return key, value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pypto-patch",
        description="Pin a HuggingFace model folder's auto_map to modeling code this project maintains.",
    )
    p.add_argument("--version", action="version", version=f"pypto-patch {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{apply,restore,status,verify,list}")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    common.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more detail on stderr (-v: progress and multi-line messages, -vv: debug)",
    )
    common.add_argument(
        "--lock-timeout", type=float, default=60.0, help="seconds to wait for another run (60)"
    )

    a = sub.add_parser("apply", parents=[common], help="patch a folder (the default command)")
    a.add_argument("--model-path", required=True, help="the model folder (holds config.json)")
    a.add_argument("--model-family", help="an installed preset (see `pypto-patch list`)")
    a.add_argument(
        "--auto-map",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="custom mode: an auto_map entry, e.g. AutoModelForCausalLM=modeling_x.XForCausalLM (repeatable)",
    )
    a.add_argument(
        "--copy",
        action="append",
        default=[],
        metavar="DEST=SOURCE",
        help="custom mode: place SOURCE at DEST inside the folder (repeatable)",
    )
    a.add_argument(
        "--source-root", help="where relative --copy sources live (default: the current folder)"
    )
    a.add_argument("--output-dir", help="build an overlay folder here instead of patching in place")
    a.add_argument(
        "--force",
        action="store_true",
        help="re-pin over an existing pin whose patched files were edited (in place the edits "
        "are kept as <name>.pypto_edited; with --replace-overlay, edits inside the old overlay "
        "are discarded)",
    )
    a.add_argument(
        "--replace-overlay",
        action="store_true",
        help="replace an overlay pypto-patch built earlier at --output-dir (recognised by its "
        "bound marker file); a non-empty folder that is not one is always refused",
    )
    a.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")

    r = sub.add_parser(
        "restore", parents=[common], help="return a patched folder to its original bytes"
    )
    r.add_argument("--model-path", required=True)
    r.add_argument(
        "--force",
        action="store_true",
        help="restore even if patched files were edited (edits are kept aside)",
    )

    s = sub.add_parser(
        "status",
        parents=[common],
        help="is this folder patched, and changed since? (exit 0, NOT_PATCHED or MODIFIED)",
    )
    s.add_argument("--model-path", required=True)

    v = sub.add_parser(
        "verify",
        parents=[common],
        help="prove every auto_map entry (and other remote-code hook) leads only to placed, "
        "unchanged code, before loading with trust_remote_code (exit 0 or NOT_PINNED)",
    )
    v.add_argument("--model-path", required=True)

    sub.add_parser("list", parents=[common], help="installed presets")
    return p


def _emit(
    args: argparse.Namespace, doc: dict[str, Any], human: str, shell: str | None = None
) -> None:
    if args.json:
        print(json.dumps(redact_obj(doc), indent=2, sort_keys=True))
    elif shell is not None:
        print(shell)
    if human:
        print(redact(human), file=sys.stderr)


def _short(value: Any, limit: int = 100) -> str:
    """A JSON value from a stranger's file as one short line."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _removed_lines(removed: Sequence[dict[str, Any]]) -> list[str]:
    return [
        f"  unpinned  {r['file']} {r['at']}[{_short(r['key'])}] = {_short(r['value'])}"
        for r in removed
    ]


def _parse_auto_map(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, value = _kv("--auto-map", item)
        if value.startswith("["):
            try:
                out[key] = json.loads(value)
            except ValueError:
                raise BadInputError(
                    f'--auto-map {key}: {value!r} is not a JSON list like ["tok.Slow", null]'
                ) from None
        else:
            out[key] = value
    return out


def _cmd_apply(args: argparse.Namespace) -> int:
    copies = dict(_kv("--copy", c) for c in args.copy)
    for path in (args.model_path, args.output_dir):
        if path is not None and ("\n" in path or "\x00" in path):
            raise BadInputError(
                f"{path!r} contains a newline or NUL; the export line could not carry it: rename the folder"
            )
    res = apply(
        args.model_path,
        family=args.model_family,
        auto_map=_parse_auto_map(args.auto_map) or None,
        copies=copies or None,
        source_root=args.source_root,
        output_dir=args.output_dir,
        force=args.force,
        replace_overlay=args.replace_overlay,
        dry_run=args.dry_run,
        lock_timeout=args.lock_timeout,
    )
    lines = [f"{res.action}: {res.family} {res.preset_version} ({res.mode}) -> {res.model_path}"]
    if res.restored_first:
        lines.append("  the previous patch is restored first")
    if res.replaced_overlay:
        lines.append("  the earlier overlay there was replaced")
    for c in res.changes:
        lines.append(
            f"  {c.action:9} {c.path}"
            + (f"  (backup {c.backup})" if c.backup and c.action == "replaced" else "")
        )
    for d in res.created_dirs:
        lines.append(f"  mkdir     {d}/")
    for p in res.cache_purged:
        lines.append(f"  purged    {p}")
    if res.removed_auto_map:
        lines.append(
            f"  {len(res.removed_auto_map)} entr{'y' if len(res.removed_auto_map) == 1 else 'ies'} "
            "pointing at the repo's own code removed from the pinned view:"
        )
        lines += _removed_lines(res.removed_auto_map)
    shell = None if res.action.startswith("dry-run") else export_line("MODEL_PATH", res.model_path)
    _emit(args, res.to_dict(), "\n".join(lines), shell)
    return EXIT.OK


def _cmd_restore(args: argparse.Namespace) -> int:
    res = restore(args.model_path, force=args.force, lock_timeout=args.lock_timeout)
    lines = [f"{res.action}: {res.model_path}"]
    lines += [f"  restored  {p}" for p in res.restored]
    lines += [f"  removed   {p}" for p in res.removed]
    lines += [f"  kept your edit of {k} as {v}" for k, v in res.kept_aside.items()]
    _emit(args, res.to_dict(), "\n".join(lines))
    return EXIT.OK


def _cmd_status(args: argparse.Namespace) -> int:
    st = status(args.model_path, lock_timeout=args.lock_timeout)
    if not st.patched:
        human = f"{st.model_path}: not patched" + (
            " (an interrupted run will be rolled back by the next apply/restore)"
            if st.interrupted
            else ""
        )
        code = EXIT.NOT_PATCHED
    else:
        human = f"{st.model_path}: patched ({st.mode}) with {st.family} {st.preset_version} on {st.created_at}"
        if st.source_path and st.mode == "overlay":
            human += f", overlay of {st.source_path}"
        if st.changed_since:
            human += f"; changed since: {', '.join(st.changed_since)}"
        if st.backups_damaged:
            human += f"; damaged backups: {', '.join(st.backups_damaged)}"
        if st.source_changed:
            human += f"; source files changed since: {', '.join(st.source_changed)}"
        if st.removed_auto_map:
            human += f"; {len(st.removed_auto_map)} auto_map entr{'y' if len(st.removed_auto_map) == 1 else 'ies'} unpinned"
        code = EXIT.OK if st.intact else EXIT.MODIFIED
    _emit(args, st.to_dict(), human)
    return code


def _cmd_verify(args: argparse.Namespace) -> int:
    res = verify_pinned(args.model_path, lock_timeout=args.lock_timeout)
    human = (
        f"pinned: {res.model_path} ({res.mode}, {res.family} {res.preset_version}) reaches only "
        f"placed code: {', '.join(sorted(res.modules)) or 'no modules'}"
    )
    _emit(args, res.to_dict(), human)
    return EXIT.OK


def _cmd_list(args: argparse.Namespace) -> int:
    found = discover_presets()
    doc = {
        "presets": [found.presets[k].to_summary() for k in sorted(found.presets)],
        "errors": found.errors,
    }
    lines = [
        f"{p.family:24} {p.version:10} {p.distribution or '-':28} {p.description}"
        for p in (found.presets[k] for k in sorted(found.presets))
    ] or ["no presets installed (install a pypto-models-<family> package)"]
    lines += [f"BROKEN {k}: {v}" for k, v in found.errors.items()]
    _emit(args, doc, "\n".join(lines))
    return EXIT.OK


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The seed's bare form: `pypto-patch --model-family F --model-path DIR` means apply.
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version"):
        argv = ["apply", *argv]
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return int(exc.code or 0) and EXIT.USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT.USAGE
    with cli_logging(["pypto_patch"], args.verbose, fmt="pypto-patch: %(message)s"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    handler = {
        "apply": _cmd_apply,
        "restore": _cmd_restore,
        "status": _cmd_status,
        "verify": _cmd_verify,
        "list": _cmd_list,
    }[args.command]
    try:
        return handler(args)
    except PatchError as err:
        _error(str(err))
        return err.exit_code
    except argparse.ArgumentTypeError as err:
        _error(str(err))
        return EXIT.USAGE
    except OSError as err:
        where = f" ({os.fspath(err.filename)})" if err.filename else ""
        _error(f"{err.strerror or err}{where}; nothing was left half done")
        return EXIT.FAILED
    except RecursionError:  # a last guard: every JSON read is depth-limited already
        _error("input nested too deeply to process; nothing was changed")
        return EXIT.USAGE


def _error(message: str) -> None:
    print(f"pypto-patch: error: {redact(' '.join(message.split()))}", file=sys.stderr)
