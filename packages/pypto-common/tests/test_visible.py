"""Text from strangers shown on one line: every control, bidi and invisible character goes."""

from __future__ import annotations

import pytest

from pypto_common.html import esc
from pypto_common.visible import INVISIBLE, has_invisible, visible

# Each one was seen to survive one of the five character classes this module replaced:
# zero-width ones make two module names look the same, U+2028 breaks a line in terminals
# and editors that honour it, the rest reorder or hide what follows.
HOSTILE = [
    "\x1b", "\x07", "\r", "\x85", "\u202e", "\u2066", "\u061c", "\u200e",
    "\u200b", "\u200c", "\u200d", "\u2028", "\u2029", "\u2060", "\ufeff", "\u00ad",
    "\u180e", "\u2064", "\ufff9",
]  # fmt: skip


@pytest.mark.parametrize("char", HOSTILE)
def test_every_hostile_character_is_replaced(char: str) -> None:
    text = f"model.layers{char}.1"
    assert has_invisible(text)
    shown = visible(text)
    assert not has_invisible(shown)
    assert shown == "model.layers\ufffd.1"
    if char not in "\t\n\r":  # a page keeps line breaks
        assert char not in esc(text)


def test_ordinary_text_of_every_script_passes_unchanged() -> None:
    for text in ("model.layers.1.mlp", "Llama-3 8B", "日本語のモデル", "модель", "مدل", "é ü ß"):
        assert not has_invisible(text)
        assert visible(text) == text


def test_html_keeps_line_breaks_and_tabs_and_the_terminal_form_does_not() -> None:
    assert esc("a\tb\nc") == "a\tb\nc"
    assert INVISIBLE.sub("?", "a\tb\nc") == "a?b?c"
