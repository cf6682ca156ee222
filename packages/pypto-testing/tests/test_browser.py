"""The browser check sees what it claims to: console errors, requests, the DOM, a screenshot."""

from __future__ import annotations

import os
import subprocess

import pytest

from pypto_testing.browser import open_page, request_host, skip_reason

needs_chromium = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


def _chromium_pids() -> set[int]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    pids = set()
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if "--proxy-bypass-list=<-loopback>" in args and int(pid) != os.getpid():
            pids.add(int(pid))
    return pids


@needs_chromium
def test_a_misbehaving_page_is_caught(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
        "<h1 id='h'>before</h1>"
        "<img src='http://example.invalid/pixel.png'>"
        "<img src='http://localhost:8/local.png'>"
        "<script>document.getElementById('h').textContent = 'after'; missing();</script>"
        "</body></html>"
    )
    before = _chromium_pids()
    got = open_page(page, width=1000, height=600)
    assert any("Uncaught ReferenceError: missing" in line for line in got.console_errors)
    hosts = {request_host(r) for r in got.requests}
    assert {"example.invalid", "localhost"} <= hosts  # loopback is counted too
    assert '<h1 id="h">after</h1>' in got.dom  # the DOM after the script ran
    assert got.screenshot_size == (1000, 600)
    assert got.screenshot.read_bytes()[:4] == b"\x89PNG"
    assert _chromium_pids() <= before  # every process it started has ended


@needs_chromium
def test_a_quiet_offline_page_is_clean(tmp_path):
    page = tmp_path / "ok.html"
    page.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'\">"
        "</head><body><p>hello</p><img src='http://example.invalid/blocked.png'></body></html>"
    )
    got = open_page(page)
    assert got.requests == []  # the CSP refused the load before any connection...
    assert any("Content Security Policy" in line for line in got.console_errors)  # ...and said so
    assert got.screenshot_size == (1280, 2000)
    assert "<p>hello</p>" in got.dom


def test_request_lines_name_their_host():
    assert request_host("CONNECT accounts.google.com:443 HTTP/1.1") == "accounts.google.com"
    assert request_host("GET http://Example.invalid:80/x?y=1 HTTP/1.1") == "example.invalid"
    assert request_host("<connection>") == ""
