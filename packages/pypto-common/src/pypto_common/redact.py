"""Redaction of secrets from anything a tool prints, logs or writes to disk.

Why one helper: a token can reach output by many roads (a ``--token`` in a recorded
command line, ``user:pass@`` in an endpoint URL, a server echoing the Authorization
header into an error body, ``HF_TOKEN`` read from the environment). Each tool applying
its own partial ``str.replace`` is how secrets leaked before; every tool calls this.

A known secret is masked in every form it travels in, not only verbatim: its URL
(percent) encodings, its JSON-escaped form, and the parts of base64 that only it
determines (so ``Authorization: Basic base64(user:secret)`` is masked whatever the user
name, at each of the three byte alignments). Each form is also masked when a tool wrapped
it across lines (twine's rich output wraps at 80 columns; a continuation line may be
indented or carry a prefix), and a line that ends with the start of a form or starts with
its end is masked too, so a caller that prints one line of wrapped output leaks nothing.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import re
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, quote, quote_plus, urlencode, urlsplit, urlunsplit

__all__ = [
    "MASK",
    "SECRET_ENV_VARS",
    "SECRET_FLAGS",
    "RedactingFilter",
    "known_secrets",
    "redact",
    "redact_argv",
    "redact_obj",
    "redact_url",
    "secret_forms",
]

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
# A derived form (a base64 run, a wrapped piece at a line's edge) shorter than this could
# occur by chance; the secret's own text is masked from _MIN_SECRET_LEN on.
_MIN_FORM_LEN = 8
# Forms at least this long may also be matched across a line break whose continuation
# line starts with a prefix of up to 64 characters that ends in a blank, "|", ">" or ":"
# ("INFO     ", "| ", "remote: "); shorter ones only across a break and indentation.
# The delimiter keeps a form's first characters at one line's end from pairing with the
# rest of it deep inside the next line (masking the text in between).
_PREFIXED_WRAP_LEN = 16
_LONG_WRAP_PREFIX = r"(?:[^\n]{0,63}?[ \t|>:])?"
# A line break a tool inserted when wrapping: trailing blanks, the newline (also as the
# two characters of an escaped one, in JSON or repr text), then the continuation's start.
_BREAK = r"[ \t]*(?:\r?\n|(?:\\r)?\\n)"
_LINE_SPLIT = re.compile(r"(\r?\n|(?:\\r)?\\n)")
# What a base64 core runs on into: the 2-3 characters its last bytes share with what
# follows (in ``user:secret``: the padding, which may sit on the next line).
_B64_CHAR = "[A-Za-z0-9+/_-]"
_B64_TAIL = (
    rf"(?:(?:{_BREAK}[ \t]*)?{_B64_CHAR}){{0,3}}(?:(?:{_BREAK}[ \t]*)?=){{1,2}}"
    rf"|{_B64_CHAR}{{0,3}}={{0,2}}"
)


def _base64_cores(secret: bytes) -> list[str]:
    """The base64 text that only ``secret`` decides, at each of the 3 byte alignments.

    In ``base64(prefix + secret + suffix)`` a 4-character group is fixed by the secret
    alone when its 3 bytes all lie inside it; which bytes those are depends on
    ``len(prefix) % 3``. Standard and URL-safe alphabets both.
    """
    cores: list[str] = []
    for skip in (0, 1, 2):
        body = secret[skip:]
        whole = len(body) - len(body) % 3
        core = base64.b64encode(body[:whole]).decode("ascii")
        if len(core) >= _MIN_FORM_LEN:
            cores.append(core)
            cores.append(core.replace("+", "-").replace("/", "_"))
    return cores


def secret_forms(secret: str) -> list[str]:
    """Every text form of ``secret`` that :func:`redact` masks, longest first.

    The secret itself; its percent-encodings (``quote``, ``quote_plus``, upper- and
    lower-case hex); its JSON-escaped form; and its base64 cores (see above) on their
    own, which covers ``base64(secret)`` and ``base64(user:secret)`` for any user.
    """
    forms = {secret}
    for encoded in (quote(secret, safe=""), quote(secret), quote_plus(secret, safe="")):
        forms.add(encoded)
        forms.add(re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), encoded))
    forms.add(json.dumps(secret)[1:-1])
    forms.add(json.dumps(secret, ensure_ascii=False)[1:-1])
    forms.update(_base64_cores(secret.encode("utf-8")))
    return sorted(
        (f for f in forms if len(f) >= (_MIN_SECRET_LEN if f == secret else _MIN_FORM_LEN)),
        key=lambda f: (-len(f), f),
    )


def _wrapped(form: str) -> str:
    """A pattern for ``form`` with an optional tool-inserted line break between any two
    of its characters."""
    prefix = _LONG_WRAP_PREFIX if len(form) >= _PREFIXED_WRAP_LEN else r"[ \t]*"
    gap = f"(?:{_BREAK}{prefix})?"
    return gap.join(re.escape(ch) for ch in form)


def _edge_pattern(form: str) -> str:
    """A pattern for a line ending with the start of ``form`` (at least _MIN_FORM_LEN
    characters of it): what is left of a wrapped secret when a caller keeps only one of
    its lines. Run on the reversed text with the reversed form, it finds a line, or a
    word after a line's prefix, that starts with the end of ``form``."""
    chars = [re.escape(ch) for ch in form]
    rest = ""
    for ch in reversed(chars[_MIN_FORM_LEN:]):
        rest = f"(?:{ch}{rest})?"
    return "".join(chars[:_MIN_FORM_LEN]) + rest


@functools.lru_cache(maxsize=64)
def _compiled(secrets: tuple[str, ...]) -> _Compiled:
    """The forms of ``secrets`` and the patterns that find them (see :func:`redact`)."""
    forms: list[str] = []
    for secret in secrets:
        forms += [f for f in secret_forms(secret) if f not in forms]
    forms.sort(key=lambda f: (-len(f), f))
    if not forms:
        return _Compiled((), (), (), None, None, None)
    edged = [f for f in forms if len(f) >= 2 * _MIN_FORM_LEN]
    cores = {c for secret in secrets for c in _base64_cores(secret.encode("utf-8"))}
    wrapped = re.compile(
        "|".join(_wrapped(f) + (f"(?:{_B64_TAIL})" if f in cores else "") for f in forms)
    )
    # A line that ends with a form's start: followed by blanks and a break, or the end.
    heads = (
        re.compile(
            "(?:" + "|".join(_edge_pattern(f) for f in edged) + rf")(?=[ \t]*(?:{_BREAK}|$))"
        )
        if edged
        else None
    )
    # A line that starts with a form's end, found in the reversed text: preceded (there:
    # followed) by a blank, a newline, an escaped newline ("n\\" reversed) or the start.
    tails = (
        re.compile("(?:" + "|".join(_edge_pattern(f[::-1]) for f in edged) + r")(?=\s|n\\|$)")
        if edged
        else None
    )
    probes = tuple(p for f in edged for p in (f[:_MIN_FORM_LEN], f[-_MIN_FORM_LEN:]))
    return _Compiled(tuple(forms), tuple(edged), probes, wrapped, heads, tails)


class _Compiled(NamedTuple):
    forms: tuple[str, ...]
    #: The forms long enough to mask pieces of (2 * _MIN_FORM_LEN characters and more).
    edged: tuple[str, ...]
    #: A form's first and last _MIN_FORM_LEN characters: text holding none of them has no
    #: line-edge piece to mask.
    probes: tuple[str, ...]
    wrapped: re.Pattern[str] | None
    heads: re.Pattern[str] | None
    tails: re.Pattern[str] | None


def _mask_line_pieces(text: str, forms: Sequence[str]) -> str:
    """Mask the last word of a line when it is a piece (>= _MIN_FORM_LEN characters) of a
    form: the middle lines of a secret wrapped over three or more lines, printed alone."""
    parts = _LINE_SPLIT.split(text)
    changed = False
    for i in range(0, len(parts), 2):  # odd indexes are the separators
        line = parts[i]
        body = line.rstrip()
        words = body.rsplit(None, 1)
        if not words or len(words[-1]) < _MIN_FORM_LEN:
            continue
        word = words[-1]
        if any(word in form for form in forms):
            parts[i] = body[: len(body) - len(word)] + MASK + line[len(body) :]
            changed = True
    return "".join(parts) if changed else text


def _mask_secrets(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every form of ``secrets`` masked: whole, wrapped, or a line-edge piece."""
    found = _compiled(tuple(secrets))
    if found.wrapped is None:
        return text
    # On one line the pattern can only find a form itself (and a base64 core's tail): a
    # line holding none of the forms skips it.
    if "\n" in text or "\\n" in text or any(form in text for form in found.forms):
        text = found.wrapped.sub(MASK, text)
    if found.heads is None or found.tails is None:
        return text
    if any(p in text for p in found.probes):
        text = found.heads.sub(MASK, text)
        text = found.tails.sub(MASK[::-1], text[::-1])[::-1]
    return _mask_line_pieces(text, found.edged)


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
    text = _mask_secrets(text, known_secrets(secrets))
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
