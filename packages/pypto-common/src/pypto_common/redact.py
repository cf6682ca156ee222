"""Redaction of secrets from anything a tool prints, logs or writes to disk.

Why one helper: a token can reach output by many roads (a ``--token`` in a recorded
command line, ``user:pass@`` in an endpoint URL, a server echoing the Authorization
header into an error body, ``HF_TOKEN`` read from the environment). Each tool applying
its own partial ``str.replace`` is how secrets leaked before; every tool calls this.
"""

from __future__ import annotations

import logging
import os
import re
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"

#: Environment variables whose values are secrets wherever they appear.
SECRET_ENV_VARS = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HUGGINGFACE_HUB_TOKEN",
    "HF_API_TOKEN",
    "PYPTO_RELEASE_TOKEN",  # the package index token tools/release.py uploads with
)

#: Command-line flags whose value (next argument or ``--flag=value``) is a secret.
SECRET_FLAGS = frozenset(
    {"--token", "--hf-token", "--password", "--api-key", "--access-token", "--auth-token"}
)

# Query parameters that carry credentials in signed or tokenised URLs.
_SECRET_QUERY_KEYS = frozenset(
    {"token", "access_token", "auth", "api_key", "apikey", "key", "password", "sig", "signature"}
)
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s@?#]+)@")
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{8,}\b")
# A PyPI API token: "pypi-" and a base64url macaroon (well over 50 characters; package
# names that start with "pypi-" are far shorter).
_PYPI_TOKEN = re.compile(r"\bpypi-[A-Za-z0-9_-]{50,}")
_AUTH_HEADER = re.compile(r"(?i)\b(authorization\s*[:=]\s*)(?:(bearer|basic|token)\s+)?[^\s,;'\"]+")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+")
_QUERY_SECRET = re.compile(
    r"(?i)([?&](?:" + "|".join(sorted(_SECRET_QUERY_KEYS)) + r")=)[^&\s#'\"]+"
)
# Shorter values are too likely to occur by chance in ordinary text to replace blindly.
_MIN_SECRET_LEN = 4


def known_secrets(extra: Iterable[str | None] = ()) -> list[str]:
    """The secret strings to mask: ``extra`` plus the token environment variables' values."""
    found = [s for s in extra if s]
    found += [v for v in (os.environ.get(name) for name in SECRET_ENV_VARS) if v]
    # Longest first so a secret containing another is masked whole.
    return sorted({s for s in found if len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every known secret, URL credential, token and auth header masked."""
    if not text:
        return text
    for secret in known_secrets(secrets):
        text = text.replace(secret, MASK)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    text = _AUTH_HEADER.sub(
        lambda m: f"{m.group(1)}{m.group(2) + ' ' if m.group(2) else ''}{MASK}", text
    )
    text = _BEARER.sub(lambda m: f"{m.group(1)}{MASK}", text)
    text = _HF_TOKEN.sub(MASK, text)
    text = _PYPI_TOKEN.sub(MASK, text)
    return _QUERY_SECRET.sub(lambda m: f"{m.group(1)}{MASK}", text)


def redact_url(url: str, secrets: Iterable[str | None] = ()) -> str:
    """``url`` without its ``user:password@`` part or credential query parameters.

    The host, path and harmless parameters stay, so a redacted endpoint still says
    which server was used.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact(url, secrets)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, MASK if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in pairs], safe="*"
        )
    rebuilt = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    return redact(rebuilt, secrets)


def redact_argv(argv: Sequence[str], secrets: Iterable[str | None] = ()) -> list[str]:
    """A command line safe to record: secret flags' values masked, then :func:`redact`."""
    secret_list = known_secrets(secrets)
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        flag, eq, _value = arg.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}={MASK}")
            else:
                out.append(arg)
                mask_next = True
            continue
        out.append(redact(arg, secret_list))
    return out


def redact_obj(obj: Any, secrets: Iterable[str | None] = ()) -> Any:
    """A copy of a JSON-like value with every string redacted (keys named like secrets masked)."""
    secret_list = known_secrets(secrets)

    def walk(value: Any, key: str | None = None) -> Any:
        if key is not None and key.lower() in {"token", "hf_token", "password", "api_key"}:
            return None if value is None else MASK
        if isinstance(value, str):
            return redact(value, secret_list)
        if isinstance(value, Mapping):
            return {k: walk(v, k if isinstance(k, str) else None) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        return value

    return walk(obj)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record's final message (args merged in).

    Attach it to a handler, not a logger: records from child loggers reach handlers
    without passing their ancestors' logger filters.
    """

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record still gets logged, redacted as far as possible
            message = str(record.msg)
        record.msg = redact(message, self.secrets)
        record.args = None
        # Formatters fill exc_text only after filters ran: format the traceback here so
        # the redacted text is what they print (a library logging exc_info=True may carry
        # a credentialed URL in it).
        if record.exc_info and not record.exc_text:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, self.secrets)
        return True
