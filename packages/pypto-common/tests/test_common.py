"""pypto-common: redaction, exit-code tables, export lines, CLI logging, atomic writes."""

from __future__ import annotations

import io
import logging
import shlex
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pypto_common as pc

TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUv"


def test_redact_masks_tokens_urls_headers_and_env(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "s3cr3t-from-env")
    text = (
        f"token {TOKEN} at https://alice:pw0rd@hub.example/x?token=abc&rev=main "
        "Authorization: Bearer zzz999 and s3cr3t-from-env"
    )
    out = pc.redact(text)
    for secret in (TOKEN, "alice", "pw0rd", "abc", "zzz999", "s3cr3t-from-env"):
        assert secret not in out
    assert "hub.example/x" in out
    assert "rev=main" in out


PYPI_TOKEN = "pypi-AgEIcHlwaS5vcmcCJGE0ZDk3ZTk4LWExYjItNGM1ZC05ZTZmLTAwMTEyMjMzNDQ1NQACKlsz"


def test_redact_masks_package_index_tokens_and_the_release_token_env(monkeypatch):
    """tools/release.py uploads with $PYPTO_RELEASE_TOKEN (a PyPI token, or any string for
    another index): both are masked wherever they appear, e.g. on a nox command line."""
    monkeypatch.setenv("PYPTO_RELEASE_TOKEN", "index-s3cret-42")
    out = pc.redact(f"upload {PYPI_TOKEN} then index-s3cret-42 done")
    assert PYPI_TOKEN[8:] not in out
    assert "index-s3cret-42" not in out
    assert pc.redact_argv(["--dry-run", PYPI_TOKEN]) == ["--dry-run", "***"]
    # ordinary names that start the same way are left alone
    assert pc.redact("pip install pypi-simple pypto-bench") == "pip install pypi-simple pypto-bench"


def test_redact_explicit_secret_that_matches_no_pattern():
    assert "plainsecret" not in pc.redact("echo: plainsecret!", ["plainsecret"])


def test_redact_url_keeps_host_and_path():
    out = pc.redact_url("https://u:p@mirror.example:8443/api?sig=XYZ&a=1")
    assert out == "https://***@mirror.example:8443/api?sig=***&a=1"


def test_redact_argv_masks_flag_values_in_both_forms():
    argv = ["run", "--token", "abcd1234", f"--token={TOKEN}", "--endpoint", "http://u:p@h/"]
    out = pc.redact_argv(argv)
    assert out == ["run", "--token", "***", "--token=***", "--endpoint", "http://***@h/"]


def test_redact_obj_walks_nested_values():
    obj = {"token": "x1234", "cmd": ["--token", TOKEN], "n": 3, "url": "http://a:b@h"}
    out = pc.redact_obj(obj)
    assert out["token"] == "***"
    assert TOKEN not in str(out)
    assert "a:b" not in str(out)
    assert out["n"] == 3


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=8, max_size=40))
def test_any_explicit_secret_never_survives(secret):
    text = f"pre {secret} mid {secret}post"
    assert secret not in pc.redact(text, [secret])


def test_filter_redacts_records_with_args():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(pc.RedactingFilter(["topsecret"]))
    log = logging.getLogger("pypto_common_test_filter")
    log.addHandler(handler)
    log.propagate = False
    log.warning("got %s from %s", "topsecret", "https://u:p@h/")
    assert "topsecret" not in stream.getvalue()
    assert "u:p" not in stream.getvalue()


def test_exit_table_by_name_and_range_checks():
    table = pc.ExitCodeTable("pypto-bench", [(40, "LOAD_FAILED", "model did not load")])
    assert table.LOAD_FAILED == 40
    assert table.OK == 0
    assert table.USAGE == 2
    assert table.name_of(40) == "LOAD_FAILED"
    assert 40 in table
    with pytest.raises(AttributeError):
        _ = table.NOPE
    with pytest.raises(ValueError, match="outside its range"):
        pc.ExitCodeTable("pypto-bench", [(12, "X", "wrong range")])
    with pytest.raises(ValueError, match="twice"):
        pc.ExitCodeTable("pypto-bench", [(40, "A", ""), (41, "A", "")])
    with pytest.raises(ValueError, match="shared"):
        pc.ExitCodeTable("pypto-bench", [(1, "OOPS", "")])


def test_a_second_range_is_its_tools_alone():
    """pypto-bench's 40-49 is full: its second range 110-119 takes the numerical gate's
    code; no other tool may use it, and past it is still outside."""
    assert pc.EXTRA_EXIT_RANGES["pypto-bench"] == range(110, 120)
    assert pc.ExitCodeTable("pypto-bench", [(110, "INACCURATE", "")]).INACCURATE == 110
    with pytest.raises(ValueError, match="outside its range"):
        pc.ExitCodeTable("pypto-bench", [(120, "X", "past the second range")])
    with pytest.raises(ValueError, match="outside its range"):
        pc.ExitCodeTable("pypto-tune", [(110, "X", "pypto-bench's second range")])
    for extra in pc.EXTRA_EXIT_RANGES.values():
        assert all(not set(extra) & set(r) for r in pc.EXIT_RANGES.values())


def test_ranges_do_not_overlap():
    seen: set[int] = set()
    for r in pc.EXIT_RANGES.values():
        assert not seen & set(r)
        assert r.start >= 10
        seen |= set(r)


@pytest.mark.parametrize("value", ["/a b/c", "/x/$(touch pwned)", "/q'uote", "/semi;colon"])
def test_export_line_round_trips_through_sh(tmp_path, value):
    line = pc.export_line("MODEL_PATH", value)
    out = subprocess.run(
        ["sh", "-c", f'{line}; printf %s "$MODEL_PATH"'],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.stdout == value
    assert not list(tmp_path.iterdir())
    assert shlex.split(line)[1] == f"MODEL_PATH={value}"


def test_export_line_refuses_newlines_and_bad_names():
    with pytest.raises(ValueError):
        pc.export_line("MODEL_PATH", "a\nb")
    with pytest.raises(ValueError):
        pc.export_line("1BAD", "x")


def test_cli_logging_levels_and_one_line():
    stream = io.StringIO()
    pc.configure_cli_logging(["pypto_common_own"], 0, stream=stream, secrets=["pw123456"])
    logging.getLogger("pypto_common_own").info("step one pw123456")
    logging.getLogger("httpx").info("HTTP Request: GET http://x")
    logging.getLogger("pypto_common_own").warning("line1\nline2")
    text = stream.getvalue()
    assert "step one ***" in text
    assert "HTTP Request" not in text
    assert "line2" not in text
    stream2 = io.StringIO()
    pc.configure_cli_logging(["pypto_common_own"], -1, stream=stream2)
    logging.getLogger("pypto_common_own").warning("quiet please")
    assert stream2.getvalue() == ""


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    target.write_text("old")
    pc.atomic_write_text(target, "new")
    assert target.read_text() == "new"

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError):
        pc.atomic_write_text(target, "newer")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


@pytest.mark.parametrize(
    "name",
    [
        ".pypto_patch.json",
        "sub/.pypto_patch.journal.json",
        "config.json.pypto_orig",
        ".cache/pypto-download/x.json",
        ".pypto_patch.overlay.json",
    ],
)
def test_tool_owned_names_are_recognised(name):
    assert pc.tool_owned_reason(name)


@pytest.mark.parametrize(
    "name", ["config.json", "model.safetensors", ".cache/other/x", ".gitattributes"]
)
def test_ordinary_names_are_not_tool_owned(name):
    assert pc.tool_owned_reason(name) is None


def test_non_propagating_library_handlers_are_redacted_too():
    lib = logging.getLogger("transformers")
    stream = io.StringIO()
    own = logging.StreamHandler(stream)
    saved = (lib.handlers[:], lib.propagate)
    lib.handlers[:] = [own]
    lib.propagate = False
    try:
        pc.configure_cli_logging(
            ["pypto_common_own"], 0, stream=io.StringIO(), secrets=["tok12345"]
        )
        lib.warning("loading with tok12345")
    finally:
        lib.handlers[:], lib.propagate = saved
    assert "tok12345" not in stream.getvalue()
    assert "loading with ***" in stream.getvalue()


def test_tracebacks_are_redacted_too():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(pc.RedactingFilter(["pw-in-trace"]))
    log = logging.getLogger("pypto_common_test_trace")
    log.addHandler(handler)
    log.propagate = False
    try:
        raise RuntimeError("GET http://u:pw-in-trace@host/x failed")
    except RuntimeError:
        log.warning("request failed", exc_info=True)
    assert "pw-in-trace" not in stream.getvalue()
    assert "RuntimeError" in stream.getvalue()


def test_cli_logging_routes_a_propagating_library_handler_once_and_restores_it():
    lib = logging.getLogger("huggingface_hub")
    lib_stream = io.StringIO()
    lib_handler = logging.StreamHandler(lib_stream)
    lib.addHandler(lib_handler)
    level_before = logging.getLogger().level
    try:
        out = io.StringIO()
        with pc.cli_logging(["pypto_common_own"], 0, stream=out, secrets=["sekret99"]):
            lib.warning("hub says sekret99")
        assert lib_stream.getvalue() == ""
        assert out.getvalue().count("hub says ***") == 1
        assert lib_handler in lib.handlers
        assert logging.getLogger().level == level_before
        assert not any(getattr(h, "_pypto_cli", False) for h in logging.getLogger().handlers)
    finally:
        lib.removeHandler(lib_handler)
