"""Text written by strangers, made safe to show a person on one line.

Why one place: a model path, a module name in a dump, a history row or a server's error
body reaches terminals, markdown and HTML pages. Controls there rewrite what a terminal
shows (an escape sequence, a carriage return), bidi controls reorder it (a right-to-left
override turned ``evil.exe`` into what read as another name), and invisible characters
make two different names look identical (a zero-width space inside ``model.layers.1``).
Each tool keeping its own character class is how U+200B, U+2028 and U+FEFF were missed
by four of five copies; every tool uses this one.
"""

from __future__ import annotations

import re

__all__ = ["INVISIBLE", "INVISIBLE_EXCEPT_WHITESPACE", "has_invisible", "visible"]

_BEYOND_C0 = (
    "\x7f-\x9f"  # DEL and the C1 controls
    "\u00ad"  # soft hyphen
    "\u061c"  # Arabic letter mark
    "\u180e"  # Mongolian vowel separator
    "\u200b-\u200f"  # zero-width space / non-joiner / joiner, LRM, RLM
    "\u2028-\u202e"  # line and paragraph separators, bidi embeddings and overrides
    "\u2060-\u206f"  # word joiner, invisible operators, bidi isolates, deprecated formats
    "\ufeff"  # zero-width no-break space (BOM)
    "\ufff9-\ufffb"  # interlinear annotation controls
)
#: Every character :func:`visible` replaces: the C0 controls and the above.
INVISIBLE = re.compile(f"[\x00-\x1f{_BEYOND_C0}]")
#: The same, but tab, newline and carriage return pass (text kept multi-line, HTML).
INVISIBLE_EXCEPT_WHITESPACE = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f{_BEYOND_C0}]")


def has_invisible(text: str) -> bool:
    """Whether ``text`` holds a control, bidi or invisible character."""
    return INVISIBLE.search(text) is not None


def visible(text: str, replacement: str = "\ufffd") -> str:
    """``text`` with each control, bidi or invisible character replaced (U+FFFD by default)."""
    return INVISIBLE.sub(replacement, text)
