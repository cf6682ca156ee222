"""Cheap, dependency-free checks on generated text.

Two different questions, kept apart on purpose:

* ``degenerate_reason`` is a hard gate: output that is empty, a single repeated token
  or mostly undecodable bytes means the port is broken (wrong weights, broken kernel,
  NaNs turned into argmax 0), whatever the language.
* ``coherence_score`` is a soft signal in [0, 1]: a random-weight test model passes the
  hard gate and still scores low, a correctly ported real model scores high. Only
  ``--strict`` turns a low score into a failure.

The coherence heuristic (documented in the README) multiplies three factors:

``printable``  share of characters that are printable or whitespace and not U+FFFD
               (undecodable bytes) or control characters;
``wordlike``   share of whitespace-separated chunks that look like words: mostly letters
               (any script), at most 20 characters, punctuation allowed around them;
``variety``    distinct word 3-grams / all word 3-grams (character 4-grams when there are
               fewer than 4 words), penalising loops such as "the the the the".

score = printable * (0.5 * wordlike + 0.5 * variety). A real model's greedy sentence
scores ~0.8-1.0; byte soup from random weights scores < 0.3.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

__all__ = [
    "REPLACEMENT",
    "coherence_score",
    "degenerate_reason",
]

REPLACEMENT = "\ufffd"
_PUNCT = "\"'()[]{}<>.,;:!?-–—*_`«»“”‘’"


def _printable_share(text: str) -> float:
    if not text:
        return 0.0
    good = 0
    for ch in text:
        if ch == REPLACEMENT:
            continue
        if ch.isspace() or (ch.isprintable() and unicodedata.category(ch)[0] != "C"):
            good += 1
    return good / len(text)


def _wordlike_share(words: Sequence[str]) -> float:
    if not words:
        return 0.0
    ok = 0
    for w in words:
        core = w.strip(_PUNCT)
        if not core or len(core) > 20:
            continue
        letters = sum(ch.isalpha() for ch in core)
        if letters / len(core) >= 0.8:
            ok += 1
    return ok / len(words)


def _variety(words: Sequence[str], text: str) -> float:
    grams: list[tuple[str, ...]] | list[str]
    if len(words) >= 4:
        grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    else:
        compact = re.sub(r"\s+", " ", text.strip())
        if len(compact) < 4:
            return 1.0 if compact else 0.0
        grams = [compact[i : i + 4] for i in range(len(compact) - 3)]
    return len(set(grams)) / len(grams)


def coherence_score(text: str) -> float:
    """Heuristic coherence in [0, 1] (see the module docstring for the formula)."""
    words = text.split()
    if not text.strip():
        return 0.0
    score = _printable_share(text) * (0.5 * _wordlike_share(words) + 0.5 * _variety(words, text))
    return round(max(0.0, min(1.0, score)), 4)


def degenerate_reason(token_ids: Sequence[int], text: str) -> str | None:
    """Why the output is degenerate, or None when it passes the hard gate."""
    if len(token_ids) >= 2 and len(set(token_ids)) == 1:
        return (
            f"degenerate output: a single token (id {token_ids[0]}) repeated {len(token_ids)} times"
        )
    if len(token_ids) == 0 or not text.strip():
        return "empty output: no tokens or only whitespace were generated"
    visible = [ch for ch in text if not ch.isspace()]
    bad = sum(1 for ch in visible if ch == REPLACEMENT or unicodedata.category(ch)[0] == "C")
    if visible and bad / len(visible) > 0.5:
        return (
            f"degenerate output: {bad} of {len(visible)} characters are undecodable bytes "
            "or control characters"
        )
    return None
