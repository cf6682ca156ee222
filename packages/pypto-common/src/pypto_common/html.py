"""One self-contained HTML page: the kit every pypto report page is built from.

A report page is read from a file:// URL, often on a machine without network, and is
built from documents that carry untrusted text (a model's name, a path from a hostile
folder, an exception message). So the kit makes the safe thing the default:

- **Escape by default.** Every value reaches the page through :func:`esc` (HTML-escaped,
  quotes included, control characters replaced, very long strings clipped). Only a
  :class:`Raw` string (markup this kit built) passes through unchanged, so a renderer has
  to opt out on purpose, never opt in.
- **Nothing from the network.** :func:`page` writes a Content-Security-Policy that lets
  the page load nothing (``default-src 'none'``; images only as ``data:`` URLs; styles
  inline) and run only the kit's own copy-button script, allowed by its SHA-256 hash: a
  ``<script>`` that slipped past escaping would still not run.
- **Plots inline.** :func:`svg_figure` turns a matplotlib figure into inline ``<svg>``
  (matplotlib is optional: without it a one-line note stands where the plot would be).

Standard library only at import time: matplotlib is imported when a plot is drawn.
"""

from __future__ import annotations

import base64
import hashlib
import html as _stdlib_html
import io
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import quote

from .visible import INVISIBLE_EXCEPT_WHITESPACE

__all__ = [
    "CSP",
    "MAX_TEXT",
    "Raw",
    "box",
    "command_block",
    "details",
    "esc",
    "join",
    "link",
    "page",
    "section",
    "svg_figure",
    "svg_plot",
    "table",
    "tag",
]

log = logging.getLogger(__name__)

#: Longest text :func:`esc` keeps; longer values are clipped with an ellipsis that says
#: how long they were (a 5000-character "model name" must not push the page apart).
MAX_TEXT = 1000

_NUMERIC = re.compile(r"^[-+]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?( \[[^\]]*\])?( ?[x%])?$")


class Raw(str):
    """Markup this kit (or a renderer using it) built: passed through unescaped.

    Everything else that reaches a page is text and is escaped; wrapping a string in
    ``Raw`` is the one, visible, way to say "this is already HTML".
    """

    __slots__ = ()


def esc(value: Any, limit: int = MAX_TEXT) -> Raw:
    """``value`` as HTML text: escaped (``&<>"'``), control characters replaced, clipped.

    ``None`` reads as ``-`` (the reports' mark for a missing value); a :class:`Raw`
    value is already markup and comes back unchanged. Clipping happens before escaping,
    so an entity is never cut in half.
    """
    if isinstance(value, Raw):
        return value
    text = "-" if value is None else str(value)
    if len(text) > limit:
        text = f"{text[: max(limit - 1, 1)]}… ({len(text)} characters)"
    return Raw(_stdlib_html.escape(INVISIBLE_EXCEPT_WHITESPACE.sub("\ufffd", text), quote=True))


def join(parts: Iterable[Any], sep: str = "") -> Raw:
    """Parts (text escaped, :class:`Raw` kept) joined by the literal ``sep``."""
    return Raw(sep.join(esc(p) for p in parts))


def tag(name: str, *children: Any, cls: str | None = None, id: str | None = None) -> Raw:
    """``<name class=.. id=..>children</name>``: children escaped unless :class:`Raw`.

    ``name`` is one of the kit's own literal tag names (never data).
    """
    attrs = ""
    if cls:
        attrs += f' class="{esc(cls)}"'
    if id:
        attrs += f' id="{esc(id)}"'
    return Raw(f"<{name}{attrs}>{join(children)}</{name}>")


def link(href: str, text: Any) -> Raw:
    """A link that can only go somewhere harmless: an ``https://`` / ``http://`` URL, or a
    relative path (percent-encoded, so ``javascript:`` in a file name is just a name)."""
    if href.startswith(("https://", "http://")):
        target = href
    else:
        target = quote(href.replace("\\", "/"), safe="/._-~")
        if target.startswith("/"):  # absolute paths: relative ones travel with the folder
            target = "file://" + target
    return Raw(f'<a href="{esc(target, limit=4096)}">{esc(text)}</a>')


def section(title: str, *parts: Any, id: str | None = None) -> Raw:
    """``<section><h2>title</h2>parts</section>``; plain-string parts become paragraphs."""
    body = "".join(p if isinstance(p, Raw) else f"<p>{esc(p)}</p>" for p in parts)
    anchor = f' id="{esc(id)}"' if id else ""
    return Raw(f"<section{anchor}><h2>{esc(title)}</h2>{body}</section>")


def box(lines: Sequence[Any], *, kind: str = "warn", title: str | None = None) -> Raw:
    """A coloured box of lines in plain sight: ``kind`` is ``warn``, ``bad``, ``ok`` or ``info``."""
    if kind not in ("warn", "bad", "ok", "info"):
        raise ValueError(f"box kind {kind!r}: use warn, bad, ok or info")
    head = f"<strong>{esc(title)}</strong>" if title else ""
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return Raw(f'<div class="box {kind}">{head}<ul>{items}</ul></div>')


def details(summary: str, body: Any) -> Raw:
    """A collapsed block (long evidence, the full command line): open to read."""
    return Raw(f"<details><summary>{esc(summary)}</summary>{esc(body)}</details>")


def table(
    headers: Sequence[Any],
    rows: Iterable[Sequence[Any]],
    *,
    classes: str | None = None,
    id: str | None = None,
    row_classes: Sequence[str | None] | None = None,
) -> Raw:
    """A table; every header and cell escaped unless it is :class:`Raw`.

    Cells that read as numbers (``12.3``, ``2.41 [2.30, 2.55]``, ``1.9x``) are right-aligned;
    ``row_classes`` marks rows (``failed``, ``unreliable``) for the stylesheet.
    """
    head = "".join(f'<th scope="col">{esc(h)}</th>' for h in headers)
    body = []
    for i, row in enumerate(rows):
        rc = row_classes[i] if row_classes is not None and i < len(row_classes) else None
        cells = []
        for cell in row:
            text = esc(cell)
            num = not isinstance(cell, Raw) and bool(_NUMERIC.match(str(cell)))
            cells.append(f'<td class="num">{text}</td>' if num else f"<td>{text}</td>")
        cls = f' class="{esc(rc)}"' if rc else ""
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    attrs = f' class="{esc(classes)}"' if classes else ""
    attrs += f' id="{esc(id)}"' if id else ""
    return Raw(
        f'<div class="wrap"><table{attrs}><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def command_block(cmd: str, *, label: str = "copy") -> Raw:
    """A command to run, as ``<pre><code>`` with a copy button (the page's one script)."""
    return Raw(
        f'<div class="cmd"><pre><code>{esc(cmd, limit=8192)}</code></pre>'
        f'<button type="button" class="copy">{esc(label)}</button></div>'
    )


def svg_figure(fig: Any, *, caption: str | None = None) -> Raw:
    """A matplotlib figure as inline ``<svg>`` in a ``<figure>`` (no XML prolog, no date).

    Text stays text (``svg.fonttype: none``: selectable, small) and ids come from a fixed
    salt, so the same figure gives the same bytes. matplotlib escapes the text it writes.
    """
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "pypto"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    svg = svg[svg.find("<svg") :] if "<svg" in svg else ""
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return Raw(f'<figure class="plot">{svg}{cap}</figure>')


def svg_plot(
    draw: Callable[[Any], None],
    *,
    size: tuple[float, float] = (8.0, 4.0),
    caption: str | None = None,
) -> Raw:
    """``draw(fig)`` on a fresh matplotlib Figure (no pyplot: no global state, no GUI
    backend), returned as :func:`svg_figure` markup.

    Without matplotlib the page still renders: a one-line note stands in for the plot.
    A drawing error is logged and noted the same way, because the page's tables carry the
    same figures and must not be lost to a plot.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return Raw(
            '<p class="note">Plot not drawn: matplotlib is not installed '
            "(pip install matplotlib, then write the page again).</p>"
        )
    fig = Figure(figsize=size, layout="constrained")
    try:
        draw(fig)
        return svg_figure(fig, caption=caption)
    except Exception as err:  # a plot must never cost the page
        log.warning(
            "plot not drawn (%s: %s); the tables hold the same figures", type(err).__name__, err
        )
        return Raw(f'<p class="note">Plot not drawn: {esc(type(err).__name__)}: {esc(err)}.</p>')


# The page's one script: copy buttons. Kept tiny and static; the CSP allows exactly this
# text (by its hash), so it must not be built from data.
_SCRIPT = """
document.addEventListener("click", function (event) {
  var button = event.target.closest("button.copy");
  if (!button) { return; }
  var code = button.parentElement.querySelector("code");
  function shown(text) {
    button.textContent = text;
    setTimeout(function () { button.textContent = "copy"; }, 1500);
  }
  function selectIt() {
    var range = document.createRange();
    range.selectNodeContents(code);
    var sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    try { return document.execCommand("copy"); } catch (err) { return false; }
  }
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(code.textContent).then(
      function () { shown("copied"); },
      function () { shown(selectIt() ? "copied" : "selected: press Ctrl+C"); });
  } else {
    shown(selectIt() ? "copied" : "selected: press Ctrl+C");
  }
});
"""

_SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.encode("utf-8")).digest()).decode()

#: The page's Content-Security-Policy: nothing loads (no network, no other file), styles
#: and ``data:`` images inline, and only the kit's own script runs (by hash: an injected
#: inline script or a ``javascript:`` URL is refused).
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    f"script-src 'sha256-{_SCRIPT_HASH}'; base-uri 'none'; form-action 'none'"
)

_STYLE = """
:root { --fg: #1b1f24; --muted: #57606a; --line: #d0d7de; --bg: #ffffff; --soft: #f6f8fa;
  --warn: #fff8c5; --warn-line: #d4a72c; --bad: #ffebe9; --bad-line: #cf222e;
  --ok: #dafbe1; --ok-line: #1a7f37; --info: #ddf4ff; --info-line: #0969da; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--fg); background: var(--bg); margin: 0 auto; padding: 16px 24px 48px;
  max-width: 1240px; overflow-wrap: anywhere; }
h1 { font-size: 1.5em; margin: 0.3em 0; }
h2 { font-size: 1.2em; margin: 1.4em 0 0.5em; padding-bottom: 0.2em;
  border-bottom: 1px solid var(--line); }
h3 { font-size: 1.05em; margin: 1em 0 0.3em; }
p { margin: 0.4em 0; }
.sub { color: var(--muted); }
.glance { font-size: 1.15em; margin: 0.6em 0; }
.badge { display: inline-block; padding: 0 0.5em; border-radius: 1em; font-size: 0.85em;
  font-weight: 600; border: 1px solid var(--line); }
.badge.ok { background: var(--ok); border-color: var(--ok-line); }
.badge.bad { background: var(--bad); border-color: var(--bad-line); }
.badge.warn { background: var(--warn); border-color: var(--warn-line); }
.wrap { overflow-x: auto; margin: 0.5em 0; }
table { border-collapse: collapse; font-size: 0.86em; }
th, td { border: 1px solid var(--line); padding: 3px 6px; text-align: left; vertical-align: top;
  overflow-wrap: break-word; }
th { background: var(--soft); vertical-align: bottom; }
td:first-child { font-weight: 600; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
tr.failed td { background: var(--bad); }
tr.unreliable td { background: var(--warn); }
.box { border: 1px solid; border-left-width: 5px; border-radius: 4px; padding: 6px 12px;
  margin: 0.6em 0; }
.box ul { margin: 0.2em 0; padding-left: 1.2em; }
.box.warn { background: var(--warn); border-color: var(--warn-line); }
.box.bad { background: var(--bad); border-color: var(--bad-line); }
.box.ok { background: var(--ok); border-color: var(--ok-line); }
.box.info { background: var(--info); border-color: var(--info-line); }
.cmd { position: relative; margin: 0.4em 0; }
pre { background: var(--soft); border: 1px solid var(--line); border-radius: 4px;
  padding: 8px 70px 8px 10px; overflow-x: auto; white-space: pre-wrap; margin: 0; }
code { font: 0.9em/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
button.copy { position: absolute; top: 6px; right: 6px; font-size: 0.8em; cursor: pointer;
  border: 1px solid var(--line); border-radius: 4px; background: var(--bg); padding: 2px 8px; }
figure.plot { margin: 0.6em 0; }
figure.plot svg { width: 100%; max-width: 1080px; height: auto; display: block; }
figcaption, .note { color: var(--muted); font-size: 0.9em; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 14px; margin: 0.7em 0; }
dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0.3em 0; }
dl.kv dt { color: var(--muted); }
dl.kv dd { margin: 0; }
details summary { cursor: pointer; color: var(--muted); }
footer { margin-top: 2em; color: var(--muted); font-size: 0.85em; }
@media print {
  body { max-width: none; padding: 0; font-size: 11pt; }
  button.copy { display: none; }
  pre { padding-right: 10px; }
  .wrap { overflow: visible; }
  section, figure, .card, .box, tr { break-inside: avoid; }
  h2 { break-after: avoid; }
  a[href]::after { content: " (" attr(href) ")"; color: var(--muted); font-size: 0.85em; }
  details > *:not(summary) { display: block; }
}
"""


def page(title: str, sections: Sequence[Any], *, subtitle: str | None = None) -> str:
    """The whole document: doctype, charset, the CSP, the stylesheet, the copy script.

    ``sections`` are :class:`Raw` markup (from :func:`section`, :func:`table`...); a plain
    string among them is text and becomes an escaped paragraph.
    """
    body = "\n".join(s if isinstance(s, Raw) else f"<p>{esc(s)}</p>" for s in sections)
    sub = f'<p class="sub">{esc(subtitle)}</p>' if subtitle else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="referrer" content="no-referrer">\n'
        f"<title>{esc(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<header><h1>{esc(title)}</h1>{sub}</header>\n<main>\n{body}\n</main>\n"
        f"<script>{_SCRIPT}</script>\n</body>\n</html>\n"
    )
