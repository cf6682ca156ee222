"""The page kit: escape by default, nothing from the network, plots inline or a note."""

from __future__ import annotations

import base64
import hashlib
import re
import sys

import pytest

from pypto_common import html as kit
from pypto_common.html import Raw, command_block, esc, link, page, section, table

HOSTILE = "<script>alert(1)</script>\"'&<img src=x onerror=alert(2)>"


def test_esc_escapes_quotes_and_tags_and_keeps_raw():
    got = esc(HOSTILE)
    assert "<" not in got
    assert ">" not in got
    assert '"' not in got
    assert "'" not in got
    assert got.startswith("&lt;script&gt;")
    assert isinstance(got, Raw)
    assert esc(got) == got  # already markup: not escaped twice
    assert esc(None) == "-"
    assert esc("a\x00b\x1bc") == "a\ufffdb\ufffdc"


def test_esc_neutralises_bidi_and_c1_controls():
    """A right-to-left override in a model path reordered what the page showed."""
    for ch in ("\u202e", "\u202a", "\u2066", "\u2069", "\u200f", "\u061c", "\x85", "\x9b"):
        assert esc(f"model{ch}gpj.exe") == "model\ufffdgpj.exe", repr(ch)
    assert esc("日本語 · café") == "日本語 · café"  # ordinary text is left alone


def test_esc_clips_long_text_before_escaping():
    got = esc("<" * 5000)
    assert got.endswith("… (5000 characters)")
    assert got.count("&lt;") == kit.MAX_TEXT - 1  # whole entities only
    assert len(esc("x" * 50, limit=10)) < 40


def test_table_escapes_every_cell_unless_raw():
    html = table(["<h>", "n"], [[HOSTILE, "12.5"], [Raw("<b>ok</b>"), "2.41 [2.30, 2.55]"]], id="t")
    assert "<script>" not in html
    assert "&lt;h&gt;" in html
    assert "<b>ok</b>" in html
    assert '<td class="num">12.5</td>' in html
    assert '<td class="num">2.41 [2.30, 2.55]</td>' in html
    assert 'id="t"' in html


def test_links_cannot_run_script_and_plain_sections_are_text():
    assert 'href="javascript%3Aalert%281%29"' in link("javascript:alert(1)", "x")
    assert 'href="https://ui.perfetto.dev"' in link("https://ui.perfetto.dev", "perfetto")
    assert 'href="../tune/report.html"' in link("../tune/report.html", "t")
    assert 'href="a%22onmouseover%3D1"' in link('a"onmouseover=1', "t")
    got = section("<T>", "plain <b>", Raw("<p>kept</p>"))
    assert "<h2>&lt;T&gt;</h2>" in got
    assert "<p>plain &lt;b&gt;</p>" in got
    assert "<p>kept</p>" in got


def test_page_allows_only_its_own_script_and_loads_nothing():
    html = page(HOSTILE, [section("s", "text"), HOSTILE, command_block("echo 'hi' && rm -rf /")])
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1)
    assert "default-src 'none'" in csp
    assert "img-src data:" in csp
    assert "'unsafe-inline'" not in csp.split("script-src", 1)[1].split(";")[0]
    # The one script on the page is exactly the one the hash allows.
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"'sha256-{digest}'" in csp
    assert "<title>&lt;script&gt;" in html
    assert "echo &#x27;hi&#x27; &amp;&amp; rm -rf /" in html
    assert '<button type="button" class="copy">' in html
    assert "@media print" in html
    assert html.count("<script") == 1


def test_svg_plot_is_inline_svg_without_prolog():
    pytest.importorskip("matplotlib")

    def draw(fig):
        ax = fig.add_subplot()
        ax.bar(["<script>", "b"], [1, 2])

    got = kit.svg_plot(draw, size=(3, 2), caption="<c>")
    assert got.startswith('<figure class="plot"><svg')
    assert "<?xml" not in got
    assert "<!DOCTYPE" not in got
    assert "<script>" not in got  # matplotlib escaped the label
    assert "<figcaption>&lt;c&gt;</figcaption>" in got
    assert got == kit.svg_plot(draw, size=(3, 2), caption="<c>")  # same figure, same bytes


def test_svg_plot_without_matplotlib_is_a_note(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    got = kit.svg_plot(lambda fig: None)
    assert "matplotlib is not installed" in got
    assert "<svg" not in got


def test_a_failing_plot_is_a_note_not_a_lost_page(caplog):
    pytest.importorskip("matplotlib")

    def draw(fig):
        raise ValueError("<bad>")

    got = kit.svg_plot(draw)
    assert "Plot not drawn: ValueError: &lt;bad&gt;" in got
    assert "plot not drawn" in caplog.text


def test_the_kit_imports_no_plotting_library():
    import subprocess

    code = (
        "import sys, pypto_common.html, pypto_common; "
        "print(sorted(m for m in ('matplotlib', 'torch', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
