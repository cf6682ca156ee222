"""CLI logging: the tool's own lines on stderr, other libraries quiet, secrets redacted."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

from .redact import RedactingFilter

__all__ = ["THIRD_PARTY_LOGGERS", "add_verbosity_flags", "cli_logging", "configure_cli_logging"]

#: Libraries whose loggers a CLI run holds at WARNING unless -v. huggingface_hub 1.x/2.x
#: talks HTTP through httpx2/httpcore2; 0.36 through httpx/requests/urllib3.
THIRD_PARTY_LOGGERS = (
    "httpx",
    "httpcore",
    "httpx2",
    "httpcore2",
    "urllib3",
    "requests",
    "huggingface_hub",
    "filelock",
    "transformers",
)


class _OneLineFormatter(logging.Formatter):
    """Multi-line messages (tracebacks, HTTP bodies) folded to their first line unless verbose."""

    def __init__(self, fmt: str, *, keep_lines: bool) -> None:
        super().__init__(fmt)
        self.keep_lines = keep_lines

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if self.keep_lines or "\n" not in text:
            return text
        first = text.splitlines()[0]
        return f"{first} [...; -v for the rest]"


def _levels(verbosity: int) -> tuple[int, int]:
    if verbosity < 0:
        return logging.ERROR, logging.ERROR
    if verbosity == 0:
        return logging.INFO, logging.WARNING
    if verbosity == 1:
        return logging.DEBUG, logging.INFO
    return logging.DEBUG, logging.DEBUG


def configure_cli_logging(
    own: Sequence[str],
    verbosity: int = 0,
    *,
    secrets: Iterable[str | None] = (),
    stream: TextIO | None = None,
    fmt: str = "%(message)s",
) -> logging.Handler:
    """Set up stderr logging for a CLI run and return the handler it installed.

    ``verbosity``: -1 quiet (errors only, one line each), 0 the tool's own loggers at
    INFO and everyone else at WARNING, 1 third-party at INFO too, 2+ DEBUG everywhere.
    Why: a hub client logging every ``HTTP Request: GET`` at INFO buried the tool's own
    step lines; those belong behind ``-v``. Libraries that bring their own handler are
    routed through ours (propagating ones lose theirs, which would print every line twice
    and unredacted; non-propagating ones get the redaction filter). Prefer
    :func:`cli_logging`, which also undoes all of this.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_pypto_cli", False):
            root.removeHandler(handler)
    secret_list = [s for s in secrets if s]
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._pypto_cli = True  # type: ignore[attr-defined]
    handler.setFormatter(_OneLineFormatter(fmt, keep_lines=verbosity >= 1))
    handler.addFilter(RedactingFilter(secret_list))
    root.addHandler(handler)
    own_level, other_level = _levels(verbosity)
    root.setLevel(other_level)
    # A failing handler must not print the record (and any secret in it) through
    # logging's own error report.
    logging.raiseExceptions = False
    for name in own:
        logging.getLogger(name).setLevel(own_level)
    for name in THIRD_PARTY_LOGGERS:
        if name in own:
            continue
        lib = logging.getLogger(name)
        lib.setLevel(other_level)
        for lib_handler in list(lib.handlers):
            if lib.propagate:
                lib.removeHandler(lib_handler)
            elif not any(isinstance(f, RedactingFilter) for f in lib_handler.filters):
                lib_handler.addFilter(RedactingFilter(secret_list))
    return handler


@contextlib.contextmanager
def cli_logging(
    own: Sequence[str],
    verbosity: int = 0,
    *,
    secrets: Iterable[str | None] = (),
    stream: TextIO | None = None,
    fmt: str = "%(message)s",
) -> Iterator[logging.Handler]:
    """:func:`configure_cli_logging` for one CLI call, with everything it changed undone.

    Why: ``main()`` also runs in-process (tests, tools, notebooks); a handler left on the
    root logger outlives the stream it writes to, and levels left changed silence or
    flood the caller's own logging.
    """
    names = ["", *own, *THIRD_PARTY_LOGGERS]
    saved = {
        name: (
            logging.getLogger(name).level,
            list(logging.getLogger(name).handlers),
            {id(h): list(h.filters) for h in logging.getLogger(name).handlers},
        )
        for name in names
    }
    raise_exceptions = logging.raiseExceptions
    handler = configure_cli_logging(own, verbosity, secrets=secrets, stream=stream, fmt=fmt)
    try:
        yield handler
    finally:
        logging.getLogger().removeHandler(handler)
        for name, (level, handlers, filters) in saved.items():
            logger = logging.getLogger(name)
            logger.setLevel(level)
            if name:
                logger.handlers[:] = handlers
            for h in handlers:
                h.filters[:] = filters[id(h)]
        logging.raiseExceptions = raise_exceptions


def add_verbosity_flags(parser: Any, *, top: bool) -> None:
    """``-v/--verbose`` (count) and ``-q/--quiet`` on a parser or a subcommand's parser.

    On subcommands the defaults are ``argparse.SUPPRESS``, so ``tool -v sub`` is not reset
    by the subcommand's own default while ``tool sub -v`` also works; the verbosity for
    :func:`cli_logging` is then ``-1 if args.quiet else int(args.verbose or 0)``.
    """
    import argparse

    kw: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        help="more detail: -v third-party INFO and full tracebacks, -vv DEBUG",
        **({"default": 0} if top else kw),
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="errors only", **kw)
