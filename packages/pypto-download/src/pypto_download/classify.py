"""Hub and OS exceptions -> our typed errors, for every HTTP stack huggingface_hub used.

huggingface_hub 0.x speaks requests/urllib3, 1.x httpx, 2.x httpx2; each wraps a
network failure differently (a read timeout inside a streamed body is a
``requests.ConnectionError`` around a urllib3 ``ReadTimeoutError`` in one, an
``httpx2.ReadTimeout`` in another). The chain of causes is walked from the newest
failure outwards, and the first exception that says what happened decides: a read
timeout, a truncated body, or a connection that could not be made.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import socket
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import (
    AuthError,
    DiskFullError,
    DownloadError,
    HubServerError,
    HubTimeoutError,
    HubUnreachableError,
    RepoNotFoundError,
    RevisionNotFoundError,
    TruncatedTransferError,
)

try:  # the 0.36 .. 2.x homes of the error classes
    from huggingface_hub import errors as _hf_errors
except ImportError:  # pragma: no cover - very old hub
    from huggingface_hub import utils as _hf_errors  # type: ignore[no-redef]

__all__ = [
    "NETWORK",
    "TRANSIENT_STATUS",
    "Context",
    "chain",
    "describe",
    "is_transient",
    "network_kind",
    "status_of",
]

TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})

_HfHubHTTPError = getattr(_hf_errors, "HfHubHTTPError", None)
_GatedRepoError = getattr(_hf_errors, "GatedRepoError", None)
_RepoNotFound = getattr(_hf_errors, "RepositoryNotFoundError", None)
_RevisionNotFound = getattr(_hf_errors, "RevisionNotFoundError", None)


def _types() -> dict[str, tuple[type[BaseException], ...]]:
    """Exception classes by what they mean, for whichever stacks are importable."""
    network: list[type[BaseException]] = [ConnectionError, TimeoutError, http.client.HTTPException]
    timeout: list[type[BaseException]] = []
    truncated: list[type[BaseException]] = [http.client.IncompleteRead]
    connect: list[type[BaseException]] = [ConnectionRefusedError, socket.gaierror]
    with contextlib.suppress(ImportError):
        import requests  # huggingface_hub 0.x

        network += [
            requests.ConnectionError,
            requests.Timeout,
            requests.exceptions.ChunkedEncodingError,
        ]
        timeout += [requests.exceptions.ReadTimeout]
        truncated += [requests.exceptions.ChunkedEncodingError]
        connect += [requests.exceptions.ConnectTimeout, requests.exceptions.ProxyError]
    with contextlib.suppress(ImportError):
        import urllib3

        network += [urllib3.exceptions.ProtocolError, urllib3.exceptions.HTTPError]
        timeout += [urllib3.exceptions.ReadTimeoutError]
        truncated += [urllib3.exceptions.IncompleteRead]
        connect += [urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError]
    for mod in ("httpx", "httpx2"):  # huggingface_hub 1.x uses httpx, 2.x httpx2
        with contextlib.suppress(ImportError):
            lib = __import__(mod)
            network.append(lib.TransportError)
            timeout += [lib.ReadTimeout, lib.WriteTimeout, lib.PoolTimeout]
            connect += [lib.ConnectError, lib.ConnectTimeout]
    return {
        "network": tuple(network),
        "timeout": tuple(timeout),
        "truncated": tuple(truncated),
        "connect": tuple(connect),
    }


_T = _types()
NETWORK = _T["network"]


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes, newest first (breadth first, ``__cause__`` before context)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [x for x in (e.__cause__, e.__context__) if x is not None]


def status_of(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _is_truncation(e: BaseException) -> bool:
    if isinstance(e, _T["truncated"]):
        return True
    text = str(e)
    # httpx/httpcore/h11: "peer closed connection without sending complete message body"
    if type(e).__name__ == "RemoteProtocolError" and "complete message body" in text:
        return True
    # huggingface_hub's own size check after a body that ended early (every version)
    return type(e) is OSError and e.errno is None and "Consistency check failed" in text


def network_kind(exc: BaseException) -> str | None:
    """ "timeout" | "truncated" | "connect" | "network" for a network failure, else None.

    The newest exception that names a specific cause wins, so a download that was cut
    and then found the server gone is "connect", and a body that stalled is "timeout"
    however many wrappers the HTTP stack put around it.
    """
    generic = False
    for e in chain(exc):
        if isinstance(e, _T["connect"]):
            return "connect"
        if _is_truncation(e):
            return "truncated"
        if isinstance(e, _T["timeout"]) or type(e) is TimeoutError:
            return "timeout"
        if isinstance(e, NETWORK):
            generic = True
    return "network" if generic else None


def is_transient(exc: BaseException) -> bool:
    """Worth another try: a network failure or a 408/425/429/5xx answer."""
    if network_kind(exc) is not None:
        return True
    return any(
        _HfHubHTTPError is not None
        and isinstance(e, _HfHubHTTPError)
        and status_of(e) in TRANSIENT_STATUS
        for e in chain(exc)
    )


def describe(exc: BaseException) -> str:
    """A few words for a retry line: ``HTTP 503`` or the failing exception's class."""
    for e in chain(exc):
        status = status_of(e)
        if status is not None:
            return f"HTTP {status}"
    kind = network_kind(exc)
    for e in chain(exc):
        if kind == "truncated" and _is_truncation(e):
            return "truncated body"
        if kind == "timeout" and (isinstance(e, _T["timeout"]) or type(e) is TimeoutError):
            return "read timeout"
        if isinstance(e, NETWORK):
            return type(e).__name__
    return type(exc).__name__


@dataclass(frozen=True)
class Context:
    """What error messages need to name (never the token, never endpoint credentials)."""

    repo_id: str
    revision: str
    endpoint: str  # as shown: credentials already masked
    has_token: bool
    read_timeout: float = 0.0
    retries: int = 0

    def classify(self, exc: BaseException, what: str = "") -> DownloadError | None:
        """Map a hub/OS exception to our typed error; None if it is not one we know."""
        for e in chain(exc):
            if isinstance(e, DownloadError):
                return e
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
                return DiskFullError(
                    f"no space left on device while downloading {self.repo_id}: free some space and re-run"
                )
        for e in chain(exc):
            if _GatedRepoError is not None and isinstance(e, _GatedRepoError):
                return AuthError(self.auth_message(gated=True, status=status_of(e)))
        for e in chain(exc):
            if _RevisionNotFound is not None and isinstance(e, _RevisionNotFound):
                return RevisionNotFoundError(
                    f"revision {self.revision!r} not found in {self.repo_id} on {self.endpoint}: "
                    "pass an existing branch, tag or commit to --revision"
                )
        for e in chain(exc):
            if _RepoNotFound is not None and isinstance(e, _RepoNotFound):
                hint = (
                    " (or your token has no access to it)"
                    if self.has_token
                    else "; if it is private or gated, pass a token with --token or HF_TOKEN"
                )
                return RepoNotFoundError(
                    f"repository {self.repo_id} not found on {self.endpoint}{hint}"
                )
        for e in chain(exc):
            if (
                _HfHubHTTPError is not None
                and isinstance(e, _HfHubHTTPError)
                and status_of(e) in (401, 403)
            ):
                return AuthError(self.auth_message(gated=False, status=status_of(e)))
        tries = f"{self.retries} retr{'y' if self.retries == 1 else 'ies'} included"
        doing = f" while {what}" if what else ""
        kind = network_kind(exc)
        if kind == "timeout":
            return HubTimeoutError(
                f"the hub at {self.endpoint} sent nothing for {self.read_timeout:g} s{doing} "
                f"(read timeout, {tries}): try again later, or raise --read-timeout / --retries"
            )
        if kind == "truncated":
            return TruncatedTransferError(
                f"the transfer from the hub at {self.endpoint} ended early{doing} (truncated body, {tries}): "
                "a proxy or the server cuts transfers; try again later, raise --retries, or use another --endpoint"
            )
        if kind is not None:
            return HubUnreachableError(
                f"cannot reach the hub at {self.endpoint} ({describe(exc)}, {tries}): check the network, "
                "or point --endpoint / HF_ENDPOINT at a reachable mirror"
            )
        if is_transient(exc):
            return HubServerError(
                f"the hub at {self.endpoint} kept failing ({describe(exc)}){doing}, {tries}: "
                "try again later or raise --retries"
            )
        return None

    def auth_message(self, *, gated: bool, status: int | None) -> str:
        what = "gated repository" if gated else "repository"
        code = f" (HTTP {status})" if status else ""
        if self.has_token:
            return (
                f"access to {what} {self.repo_id} refused{code}: the token given has no access; "
                "request access on the model page, then pass a token that has it with --token or HF_TOKEN"
            )
        return f"{what} {self.repo_id} needs authentication{code}: pass a token with --token TOKEN or set HF_TOKEN"
