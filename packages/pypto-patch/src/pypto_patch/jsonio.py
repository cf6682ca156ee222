"""JSON parsing that fails with one line instead of a traceback.

Why: every JSON file pypto-patch reads comes from a stranger's repo. ``json.loads`` of
``[[[[...`` nested 100000 deep raises RecursionError, a number of more than 4300 digits
raises a plain ValueError, and a document a few hundred levels deep parses but then
makes any recursive walk (ours, ``json.dumps``) blow the stack later. Real model
configs nest fewer than ten levels, so anything past :data:`MAX_JSON_DEPTH` is refused.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "MAX_JSON_DEPTH",
    "RECORD_MAX_DEPTH",
    "JSONUnusable",
    "dumps_config",
    "json_depth",
    "loads_limited",
]

#: Deepest nesting accepted; HF configs nest < 10 levels, the interpreter's limit is ~1000.
MAX_JSON_DEPTH = 200


class JSONUnusable(ValueError):
    """The bytes are not a usable JSON document; ``str()`` is one line saying why."""


#: pypto-patch's own records quote removed auto_map values (up to MAX_JSON_DEPTH deep)
#: a few levels down, so reading them back allows that much more.
RECORD_MAX_DEPTH = MAX_JSON_DEPTH + 16


def loads_limited(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse ``raw`` (UTF-8, BOM allowed); raise :class:`JSONUnusable` with a one-line reason."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise JSONUnusable(f"not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        data = json.loads(text, parse_constant=_not_a_number, parse_float=_finite_float)
    except JSONUnusable:
        raise
    except RecursionError:
        raise JSONUnusable(
            f"JSON nested too deeply (more than the {MAX_JSON_DEPTH} levels any model config needs)"
        ) from None
    except json.JSONDecodeError as err:
        raise JSONUnusable(
            f"not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}"
        ) from None
    except ValueError as err:  # e.g. an integer longer than the interpreter's digit limit
        raise JSONUnusable(f"not usable JSON: {str(err).splitlines()[0]}") from None
    if json_depth(data) > max_depth:
        raise JSONUnusable(
            f"JSON nested too deeply (more than the {max_depth} levels any model config needs)"
        )
    return data


def _not_a_number(name: str) -> float:
    # Python's json reads NaN / Infinity; a config holding them (rms_norm_eps: NaN) made a
    # model whose every arm "matched" on the argmax of NaN logits.
    raise JSONUnusable(
        f"not usable: it holds {name}, not a number (a model config's numbers must be finite)"
    )


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise JSONUnusable(f"holds the number {text[:20]}, beyond a float's range")
    return value


def json_depth(data: Any) -> int:
    """Nesting depth of a parsed document, computed without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in value)
    return deepest


def dumps_config(doc: Any) -> bytes:
    """How pypto-patch writes a JSON file it edits: 2-space indent, UTF-8, final newline."""
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
