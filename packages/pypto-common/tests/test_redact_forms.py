"""redact() masks a known secret in every form it travels in: whole, wrapped across lines
(any column, indented or prefixed continuation lines, one line of it on its own), base64
of the secret and of ``user:secret`` at each byte alignment, percent-encoded, JSON-escaped.

Why: tools/release.py leaked the upload token with ``-v`` because twine wrapped the
index's answer at 80 columns and printed ``base64(__token__:<token>)`` (issue 27, item 2).
"""

from __future__ import annotations

import base64
import io
import json
import logging
from urllib.parse import quote, quote_plus

import pytest

import pypto_common as pc

# A PyPI-shaped token (base64url alphabet) and a password with characters that URL- and
# JSON-encoding change.
TOKEN = "pypi-AgEIcHlwaS5vcmcCJDQ3YjM0ZjU2LTk4ZmUtNDFiZC1hMjMxLWVhZGI1ZTk3NDQ2MAACKlsz"
PASSWORD = 'p@ss/w0rd+s3cr3t=&ok?"\\ yes'


def fragments(secret: str, size: int = 8) -> list[str]:
    return [secret[i : i + size] for i in range(len(secret) - size + 1)]


def assert_no_fragment(out: str, secret: str, size: int = 8) -> None:
    leaked = [f for f in fragments(secret, size) if f in out]
    assert not leaked, f"{leaked[:3]} survived in:\n{out}"


def wrap(text: str, width: int, cont: str = "") -> str:
    """``text`` cut every ``width`` characters, each continuation line starting with ``cont``."""
    lines = [text[i : i + width] for i in range(0, len(text), width)]
    return ("\n" + cont).join(lines)


def determined(prefix: bytes, secret: bytes) -> str:
    """The part of base64(prefix + secret) fixed by the secret alone."""
    encoded = base64.b64encode(prefix + secret).decode()
    start = -(-len(prefix) // 3) * 4
    end = (len(prefix) + len(secret)) // 3 * 4
    return encoded[start:end]


@pytest.mark.parametrize("secret", [TOKEN, PASSWORD], ids=["token", "password"])
def test_the_secret_and_its_encodings_are_masked_on_one_line(secret):
    for form in (
        secret,
        quote(secret, safe=""),
        quote(secret),
        quote_plus(secret),
        quote(secret, safe="").lower(),
        json.dumps(secret)[1:-1],
    ):
        out = pc.redact(f"GET /upload?x=1&pw={form}&y=2 failed: {form}.", [secret])
        assert form not in out
        assert pc.MASK in out
        assert_no_fragment(out, form)


@pytest.mark.parametrize("user", ["", "a", "ab", "__token__", "alice", "bob@example.org"])
@pytest.mark.parametrize("secret", [TOKEN, PASSWORD], ids=["token", "password"])
def test_base64_of_the_secret_and_of_any_user_secret_pair_is_masked(user, secret):
    for prefix in (user.encode(), f"{user}:".encode()):
        raw = prefix + secret.encode()
        for encoded in (
            base64.b64encode(raw).decode(),
            base64.urlsafe_b64encode(raw).decode(),
            base64.b64encode(raw).decode().rstrip("="),
        ):
            text = f"403 Forbidden: you sent Basic {encoded}, which we refuse"
            out = pc.redact(text, [secret])
            assert encoded not in out
            assert_no_fragment(out, determined(prefix, secret.encode()))
            assert out.endswith(", which we refuse")
            # Wrapped like MIME base64 (76 columns) and like a log (indented).
            for width, cont in ((76, ""), (13, "    ")):
                out = pc.redact(wrap(text, width, cont), [secret])
                assert_no_fragment(
                    out.replace("\n" + cont, ""), determined(prefix, secret.encode())
                )


@pytest.mark.parametrize("cont", ["", "    ", "\t", "INFO     ", "| ", "remote: "])
def test_a_secret_wrapped_at_any_column_is_masked(cont):
    text = f"ERROR HTTPError: 403 Forbidden (token {TOKEN} is not valid for this project)"
    for width in range(1, len(text) + 1):
        out = pc.redact(wrap(text, width, cont), [TOKEN])
        joined = out.replace("\n" + cont, "")
        assert_no_fragment(joined, TOKEN)
        assert_no_fragment(out, TOKEN)
        # What is not the secret is kept.
        assert joined.startswith("ERROR HTTPError: 403 Forbidden (token")
        assert joined.endswith("is not valid for this project)")


def test_a_short_secret_wrapped_across_an_indented_line_is_masked():
    secret = "hunter2-pw"
    out = pc.redact("password was hunter2\n   -pw ok", [secret])
    assert "hunter2" not in out
    assert out.endswith("ok")


def test_each_line_of_a_wrapped_secret_printed_on_its_own_leaks_no_fragment():
    """What a caller that prints one line (the last error line) of wrapped output shows."""
    b64 = base64.b64encode(f"__token__:{TOKEN}".encode()).decode()
    text = f"ERROR Authorization: Basic {b64} was sent with {TOKEN} by the client"
    for width in (17, 40, 80):
        for cont in ("", "  "):
            for line in wrap(text, width, cont).splitlines():
                out = pc.redact(line, [TOKEN])
                assert_no_fragment(out, TOKEN)
                assert_no_fragment(out, determined(b"__token__:", TOKEN.encode()))


def test_wrapped_secrets_inside_json_escaped_text_are_masked():
    doc = json.dumps({"error": wrap(f"refused {TOKEN} and {quote(PASSWORD, safe='')}", 30, "  ")})
    out = pc.redact(doc, [TOKEN, PASSWORD])
    assert_no_fragment(out.replace("\\n  ", ""), TOKEN)
    assert_no_fragment(out.replace("\\n  ", ""), quote(PASSWORD, safe=""))
    assert json.loads(out)["error"].startswith("refused ")


def test_ordinary_text_is_left_alone():
    text = "\n".join(
        [
            "Uploading distributions to http://127.0.0.1:8080/",
            "INFO     pypto_capture-0.1.0-py3-none-any.whl (12.3 KB)",
            "  pypi-simple and pypto-bench are package names",
            "ZXhhbXBsZSBiYXNlNjQgdGV4dA== is some base64",
        ]
    )
    assert pc.redact(text, [TOKEN, PASSWORD]) == text


def test_the_logging_filter_masks_a_wrapped_token_in_a_multi_line_record():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(pc.RedactingFilter([TOKEN]))
    logger = logging.getLogger("pypto_common.test_redact_forms")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("twine said:\n%s", wrap(f"403 {TOKEN} refused", 20, "    "))
    finally:
        logger.removeHandler(handler)
    assert_no_fragment(stream.getvalue(), TOKEN)
    assert "refused" in stream.getvalue()


def test_secret_forms_lists_what_is_masked():
    forms = pc.secret_forms(PASSWORD)
    assert PASSWORD in forms
    assert quote(PASSWORD, safe="") in forms
    assert quote_plus(PASSWORD) in forms
    assert determined(b"", PASSWORD.encode()) in forms
    assert forms == sorted(forms, key=lambda f: (-len(f), f))
