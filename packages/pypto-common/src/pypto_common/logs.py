"""CLI logging: the tool's own lines on stderr, other libraries quiet, secrets redacted."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Sequence
from typing import TextIO

from .redact import RedactingFilter


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
    step lines; those belong behind ``-v``.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_pypto_cli", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._pypto_cli = True  # type: ignore[attr-defined]
    handler.setFormatter(_OneLineFormatter(fmt, keep_lines=verbosity >= 1))
    handler.addFilter(RedactingFilter(secrets))
    root.addHandler(handler)
    if verbosity < 0:
        own_level, other_level = logging.ERROR, logging.ERROR
    elif verbosity == 0:
        own_level, other_level = logging.INFO, logging.WARNING
    elif verbosity == 1:
        own_level, other_level = logging.DEBUG, logging.INFO
    else:
        own_level, other_level = logging.DEBUG, logging.DEBUG
    root.setLevel(other_level)
    # A failing handler must not print the record (and any secret in it) through
    # logging's own error report.
    logging.raiseExceptions = False
    for name in own:
        logging.getLogger(name).setLevel(own_level)
    # Libraries that set their own levels or handlers at import.
    for name in ("httpx", "httpcore", "urllib3", "huggingface_hub", "filelock", "transformers"):
        lib = logging.getLogger(name)
        if name not in own:
            lib.setLevel(other_level)
        # transformers logs through its own handler with propagate=False: its lines never
        # reach ours, so its handlers get the redaction filter too.
        if not lib.propagate:
            for own_handler in lib.handlers:
                if not any(isinstance(f, RedactingFilter) for f in own_handler.filters):
                    own_handler.addFilter(RedactingFilter(secrets))
    return handler
