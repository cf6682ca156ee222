"""Retries with exponential backoff that honour the server's ``Retry-After`` (bounded).

Why bounded: a rate-limited hub says how long to wait, and retrying sooner only burns
the retries; but a hostile or broken one can ask for a day, so the wait is capped
(``--max-retry-wait``) and every wait counts against ``--retries``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from typing import TypeVar

from .classify import Context, chain, describe, is_transient
from .errors import AuthError, DiskFullError, DownloadError

__all__ = ["BACKOFF_CAP", "retry_after", "retrying"]

logger = logging.getLogger("pypto_download")

_R = TypeVar("_R")

#: Backoff alone never waits longer than this between two tries.
BACKOFF_CAP = 30.0


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (``Retry-After``: seconds or an HTTP date)."""
    for e in chain(exc):
        headers = getattr(getattr(e, "response", None), "headers", None)
        if headers is None:
            continue
        try:
            value = headers.get("Retry-After")
        except Exception:  # a headers object we do not know: no hint
            return None
        if not value:
            continue
        value = str(value).strip()
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        return max(0.0, when.timestamp() - time.time())
    return None


def retrying(
    what: str,
    call: Callable[[], _R],
    *,
    retries: int,
    backoff: float,
    max_wait: float,
    ctx: Context,
    stop: threading.Event | None = None,
) -> _R:
    """Run ``call``; retry transient failures ``retries`` times.

    Waits ``backoff * 2**n`` (at most :data:`BACKOFF_CAP`), or longer when the server
    sent ``Retry-After`` (at most ``max_wait``). Non-transient failures are raised at
    once, typed; the last transient one is raised typed too.
    """
    attempt = 0
    while True:
        try:
            return call()
        except DownloadError:
            raise
        except Exception as exc:
            typed = ctx.classify(exc, what)
            transient = is_transient(exc) and not isinstance(typed, (DiskFullError, AuthError))
            if transient and attempt < retries and not (stop is not None and stop.is_set()):
                delay = min(backoff * (2**attempt), BACKOFF_CAP)
                asked = retry_after(exc)
                hint = ""
                if asked is not None:
                    delay = max(delay, min(asked, max_wait))
                    hint = f", the hub asked to wait {asked:g} s"
                attempt += 1
                logger.warning(
                    "%s failed (%s%s); retry %d/%d in %.1fs",
                    what,
                    describe(exc),
                    hint,
                    attempt,
                    retries,
                    delay,
                )
                # Another file failed while we wait: give up now with this file's error.
                if stop is None:
                    time.sleep(delay)
                    continue
                if not stop.wait(delay):
                    continue
            if typed is not None:
                raise typed from exc
            raise
