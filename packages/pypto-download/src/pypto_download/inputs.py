"""Everything checked before the first request or the first byte on disk.

Why up front: a bad value found halfway (a negative ``--backoff`` only fails when a
retry sleeps) leaves a half-filled folder and an unexpected traceback; checked here, it
is one line, exit USAGE, and nothing changed.
"""

from __future__ import annotations

import base64
import errno
import math
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pypto_common import known_secrets, redact_url

from .errors import BadInputError, DiskFullError, InvalidModelIdError, OutputPathError

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_MAX_RETRY_WAIT",
    "DEFAULT_READ_TIMEOUT",
    "Options",
    "check_options",
    "check_output_dir",
    "endpoint_secrets",
    "offline_requested",
    "resolve_endpoint",
    "resolve_token",
    "validate_model_id",
]

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_READ_TIMEOUT = 30.0
DEFAULT_MAX_RETRY_WAIT = 60.0

# A repo id is "name" or "namespace/name": letters, digits, "-", "_", "."; no "--"
# or ".." and no leading/trailing "-" or "." (the Hub's own rules), at most 96 chars.
_NAME = r"(?![-.])[A-Za-z0-9_.-]{1,96}(?<![-.])"
_MODEL_ID_RE = re.compile(rf"^(?:{_NAME}/)?{_NAME}$")


def validate_model_id(model_id: str) -> str:
    """Reject ids the Hub would reject, before any network call or disk change."""
    if (
        not isinstance(model_id, str)
        or not _MODEL_ID_RE.match(model_id)
        or "--" in model_id
        or ".." in model_id
    ):
        raise InvalidModelIdError(
            f"malformed model id {model_id!r}: expected ORG/REPO (letters, digits, '-', '_', '.'), "
            "e.g. Qwen/Qwen3-0.6B"
        )
    return model_id


def resolve_endpoint(endpoint: str | None = None) -> str:
    """``endpoint`` > ``$HF_ENDPOINT`` (read now, not at import) > huggingface.co."""
    value = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).strip().rstrip("/")
    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # a non-numeric port raises here
    except ValueError:
        ok = False
    if not ok:
        raise BadInputError(
            f"endpoint {redact_url(value)!r} is not an http(s) URL: pass e.g. --endpoint https://hf-mirror.com"
        )
    return value


def endpoint_secrets(endpoint: str) -> list[str]:
    """What of an endpoint must never be shown: its password, ``user:password`` and the
    Basic credentials an HTTP client derives from them (a server may echo that header)."""
    try:
        parts = urlsplit(endpoint)
    except ValueError:
        return []
    if parts.password is None and parts.username is None:
        return []
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    pair = f"{user}:{password}"
    found = [pair, base64.b64encode(pair.encode()).decode()]
    if password:
        found.append(password)
    userinfo = parts.netloc.rsplit("@", 1)[0]
    found.append(userinfo)
    return found


def resolve_token(token: str | None) -> str | None:
    if token:
        return token
    env = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    return env or None


def offline_requested(offline: bool | None) -> bool:
    if offline is not None:
        return offline
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _number(name: str, value: object, *, minimum: float, inclusive: bool, integer: bool) -> float:
    """One numeric option, or a one-line BadInputError naming the flag and the fix."""
    kind = "a whole number" if integer else "a number"
    bound = f"{'at least' if inclusive else 'more than'} {minimum:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInputError(f"{name} must be {kind} {bound}, not {value!r}")
    if integer and not isinstance(value, int):
        raise BadInputError(f"{name} must be {kind} {bound}, not {value!r}")
    if math.isnan(value) or math.isinf(value):
        raise BadInputError(f"{name} must be a finite number {bound}, not {value!r}")
    if value < minimum or (not inclusive and value == minimum):
        raise BadInputError(f"{name} must be {bound}, not {value:g}: e.g. {name} {_EXAMPLE[name]}")
    return value


_EXAMPLE = {
    "--max-workers": "8",
    "--retries": "3",
    "--backoff": "1",
    "--read-timeout": "30",
    "--max-retry-wait": "60",
    "chunk_size": "1048576",
}


@dataclass(frozen=True)
class Options:
    """The checked arguments of one :func:`pypto_download.fetch` call."""

    model_id: str
    out: Path
    revision: str
    endpoint: str  # the real one (may hold credentials): only ever sent to the server
    endpoint_shown: str  # what messages, the manifest and --json show
    token: str | None
    allow: list[str] | None
    ignore: list[str] | None
    max_workers: int
    retries: int
    backoff: float
    read_timeout: float
    max_retry_wait: float
    chunk_size: int | None
    secrets: tuple[str, ...]


def _patterns(value: Sequence[str] | str | None, flag: str) -> list[str] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    for item in items:
        if not isinstance(item, str) or not item:
            raise BadInputError(f"{flag} must be a non-empty glob pattern, not {item!r}")
    return items or None


def check_options(
    model_id: str,
    output_dir: str | os.PathLike[str],
    *,
    revision: str | None,
    token: str | None,
    allow_patterns: Sequence[str] | str | None,
    ignore_patterns: Sequence[str] | str | None,
    endpoint: str | None,
    max_workers: int,
    retries: int,
    backoff: float,
    read_timeout: float,
    max_retry_wait: float,
    chunk_size: int | None,
) -> Options:
    """All argument checks, in one place and before anything else happens."""
    validate_model_id(model_id)
    if revision is not None and (not isinstance(revision, str) or not revision.strip()):
        raise BadInputError("empty --revision: pass a branch, tag or commit, or omit it for 'main'")
    workers = int(_number("--max-workers", max_workers, minimum=1, inclusive=True, integer=True))
    tries = int(_number("--retries", retries, minimum=0, inclusive=True, integer=True))
    wait = float(_number("--backoff", backoff, minimum=0, inclusive=True, integer=False))
    timeout = float(
        _number("--read-timeout", read_timeout, minimum=0, inclusive=False, integer=False)
    )
    cap = float(
        _number("--max-retry-wait", max_retry_wait, minimum=0, inclusive=True, integer=False)
    )
    chunk = None
    if chunk_size is not None:
        chunk = int(_number("chunk_size", chunk_size, minimum=1, inclusive=True, integer=True))
    url = resolve_endpoint(endpoint)
    token_value = resolve_token(token)
    if not isinstance(output_dir, (str, os.PathLike)) or not os.fspath(output_dir):
        raise BadInputError("empty --output-dir: pass the folder to download into")
    return Options(
        model_id=model_id,
        out=Path(output_dir).expanduser().absolute(),
        revision=revision or "main",
        endpoint=url,
        endpoint_shown=redact_url(url),
        token=token_value,
        allow=_patterns(allow_patterns, "--allow-pattern"),
        ignore=_patterns(ignore_patterns, "--ignore-pattern"),
        max_workers=workers,
        retries=tries,
        backoff=wait,
        read_timeout=timeout,
        max_retry_wait=cap,
        chunk_size=chunk,
        secrets=tuple(known_secrets([token_value, *endpoint_secrets(url)])),
    )


def check_output_dir(out: Path) -> None:
    """Refuse an unusable destination before touching anything.

    Writability is probed for real (a temp file), because as root ``os.access`` says
    yes even on a read-only mount.
    """
    if out.exists() and not out.is_dir():
        raise OutputPathError(
            f"output path {out} exists and is not a folder: pass a folder path to --output-dir"
        )
    probe_dir = out
    while not probe_dir.exists():
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        raise OutputPathError(f"cannot create {out}: {probe_dir} is a file, not a folder")
    try:
        fd, name = tempfile.mkstemp(prefix=".pypto-download-probe-", dir=probe_dir)
        os.close(fd)
        os.unlink(name)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(
                f"no space left on the device holding {probe_dir}: free some space"
            ) from None
        raise OutputPathError(
            f"output folder {probe_dir} is not writable ({err.strerror}): choose another --output-dir"
        ) from None
