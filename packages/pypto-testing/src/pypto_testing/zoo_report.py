"""The zoo's results as pages: the per-type matrix (docs/zoo.md) and the counts per class
that the generated support matrix in the README and docs/workflow.md carries.

Why a module of its own: ``tools/zoo.py`` writes a results file (``zoo.json``: one entry
per cell, every cell classified), and ``tools/gen_docs.py`` renders the committed copy
(``docs/zoo.json``) into the pages, so the counts a reader sees are the ones a run
recorded, regenerated and checked by tests-integration/test_docs.py, never typed by hand.
Reading a results file is strict (a schema this module defines, bounded in bytes and
cells): it is written by our tool, but a page must not carry whatever a file says.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = [
    "BAD_CLASSES",
    "ZOO_CLASSES",
    "ZooResultsError",
    "load_zoo_results",
    "render_zoo_matrix",
    "worst_class",
    "zoo_counts",
]

#: Every class a cell can have, in the order the pages list them.
ZOO_CLASSES: tuple[str, ...] = (
    "ok",
    "refused",
    "WRONG",
    "crash",
    "hang",
    "eager fails",
    "not built",
    "peer fails",
)
#: Classes that make ``tools/zoo.py`` exit 1: an arm that computes something else, an
#: unexplained failure, a run past its timeout.
BAD_CLASSES: tuple[str, ...] = ("WRONG", "crash", "hang")
#: A type's class on the pages: its worst cell, in this order.
_WORST_FIRST = ("WRONG", "crash", "hang", "eager fails", "not built", "refused", "peer fails")
_MAX_BYTES = 8 * 1024 * 1024
_MAX_CELLS = 20_000
_REGIMES = ("decode", "prefill", "*")


class ZooResultsError(ValueError):
    """A zoo results file that is not one ``tools/zoo.py`` writes (the message says what)."""


def _text(value: Any, what: str, limit: int = 2000) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise ZooResultsError(f"{what} must be a string of at most {limit} characters")
    return value


def load_zoo_results(path: str | Path) -> dict[str, Any]:
    """The results ``tools/zoo.py --out`` wrote (``zoo.json``), checked against its schema.

    Raises :class:`ZooResultsError` for anything else: not a regular file, over 8 MiB, not
    JSON, unknown classes or regimes, non-finite or negative seconds, more than 20,000 cells.
    """
    p = Path(path)
    if not p.is_file():
        raise ZooResultsError(f"{p}: not a regular file")
    with p.open("rb") as fh:
        raw = fh.read(_MAX_BYTES + 1)
    if len(raw) > _MAX_BYTES:
        raise ZooResultsError(f"{p}: over {_MAX_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ZooResultsError(f"{p}: not JSON ({err})") from None
    if not isinstance(doc, dict) or set(doc) != {"meta", "cells"}:
        raise ZooResultsError(f"{p}: expected an object with 'meta' and 'cells'")
    meta, cells = doc["meta"], doc["cells"]
    if not isinstance(meta, dict) or not isinstance(cells, list):
        raise ZooResultsError(f"{p}: 'meta' must be an object and 'cells' a list")
    if len(cells) > _MAX_CELLS:
        raise ZooResultsError(f"{p}: more than {_MAX_CELLS} cells")
    clean_meta: dict[str, Any] = {}
    for key in ("transformers", "torch", "backend", "command"):
        clean_meta[key] = _text(meta.get(key, ""), f"meta.{key}")
    seconds = meta.get("seconds", 0)
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise ZooResultsError(f"{p}: meta.seconds must be a finite number >= 0")
    clean_meta["seconds"] = seconds
    clean_meta["peer"] = bool(meta.get("peer", False))
    clean_cells = []
    for i, c in enumerate(cells):
        if not isinstance(c, dict):
            raise ZooResultsError(f"{p}: cell {i} is not an object")
        cls = c.get("class")
        if cls not in ZOO_CLASSES:
            raise ZooResultsError(f"{p}: cell {i} has an unknown class {cls!r}")
        regime = c.get("regime")
        if regime not in _REGIMES:
            raise ZooResultsError(f"{p}: cell {i} has an unknown regime {regime!r}")
        year = c.get("year")
        if year is not None and (isinstance(year, bool) or not isinstance(year, int)):
            raise ZooResultsError(f"{p}: cell {i} has a year that is not an integer")
        clean_cells.append(
            {
                "type": _text(c.get("type"), f"cell {i} type", 100),
                "regime": regime,
                "class": cls,
                "year": year,
                "why": _text(c.get("why", ""), f"cell {i} why"),
            }
        )
    return {"meta": clean_meta, "cells": clean_cells}


def worst_class(classes: list[str]) -> str:
    """A type's class on the pages: the worst of its cells' (``ok`` when all are)."""
    return next((k for k in _WORST_FIRST if k in classes), "ok")


def _by_type(results: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    by_type: dict[str, dict[str, dict[str, Any]]] = {}
    for c in results["cells"]:
        by_type.setdefault(c["type"], {})[c["regime"]] = c
    return by_type


def zoo_counts(results: dict[str, Any]) -> dict[str, dict[str, int]]:
    """``{"types": {class: n}, "cells": {class: n}}`` with every class present; a type counts
    under its worst cell, a type that was not built counts no cell."""
    per_type = Counter(
        worst_class([c["class"] for c in regimes.values()])
        for regimes in _by_type(results).values()
    )
    per_cell = Counter(c["class"] for c in results["cells"] if c["regime"] != "*")
    return {
        "types": {k: per_type.get(k, 0) for k in ZOO_CLASSES},
        "cells": {k: per_cell.get(k, 0) for k in ZOO_CLASSES},
    }


def _cell_text(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "/")


def render_zoo_matrix(results: dict[str, Any], *, title: str) -> str:
    """Markdown: what ran and how, the counts per class (types and cells), then one row per
    type (newest first) with its decode and prefill classes and why its first non-ok cell
    is not ok."""
    meta = results["meta"]
    counts = zoo_counts(results)
    by_type = _by_type(results)
    lines = [
        title,
        "",
        f"transformers {meta.get('transformers')}, torch {meta.get('torch')}; graph backend "
        f"`{meta.get('backend')}`; decode and prefill, eager and graph"
        + (", hf-compile in decode" if meta.get("peer") else "")
        + f"; fp32, CPU, seq 8, gen 8, one iteration; {meta.get('seconds')} s on the machine "
        "that ran it.",
        "",
        f"Command: `{_cell_text(meta.get('command', ''))}`",
        "",
        "| class | types (worst cell) | cells |",
        "|---|---:|---:|",
    ]
    lines += [f"| {k} | {counts['types'][k]} | {counts['cells'][k]} |" for k in ZOO_CLASSES]
    lines += [
        f"| all | {len(by_type)} | {sum(counts['cells'].values())} |",
        "",
        "| type | year | decode | prefill | why (first non-ok cell) |",
        "|---|---|---|---|---|",
    ]

    def newest_first(t: str) -> tuple[int, str]:
        years = [c.get("year") or 0 for c in by_type[t].values()]
        return (-max(years), t)

    for t in sorted(by_type, key=newest_first):
        regimes = by_type[t]
        year = max((c.get("year") or 0) for c in regimes.values()) or "?"
        if "*" in regimes:
            why = _cell_text(regimes["*"]["why"])
            lines.append(f"| {t} | {year} | not built | not built | {why} |")
            continue
        d, p = regimes.get("decode", {}), regimes.get("prefill", {})
        first = next((c.get("why") for c in (d, p) if c.get("class") not in (None, "ok")), "")
        lines.append(
            f"| {t} | {year} | {d.get('class', '-')} | {p.get('class', '-')} | "
            f"{_cell_text(first or '')} |"
        )
    return "\n".join(lines) + "\n"
