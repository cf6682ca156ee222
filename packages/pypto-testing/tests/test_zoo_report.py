"""The zoo's results file read strictly and rendered: counts per class by worst cell,
one row per type newest first, hostile files refused with what is wrong."""

from __future__ import annotations

import json
import os

import pytest

from pypto_testing.zoo_report import (
    ZOO_CLASSES,
    ZooResultsError,
    load_zoo_results,
    render_zoo_matrix,
    zoo_counts,
)

META = {
    "transformers": "5.25.0", "torch": "2.13.0+cpu", "backend": "eager", "peer": False,
    "seconds": 12, "types": 3, "command": "python tools/zoo.py --out x",
}  # fmt: skip
CELLS = [
    {
        "type": "old",
        "year": 2020,
        "regime": "decode",
        "class": "refused",
        "why": "graph: no | pipes",
    },
    {"type": "old", "year": 2020, "regime": "prefill", "class": "ok", "why": ""},
    {"type": "new", "year": 2026, "regime": "decode", "class": "ok", "why": "", "arms": {}},
    {"type": "new", "year": 2026, "regime": "prefill", "class": "ok", "why": ""},
    {"type": "odd", "year": None, "regime": "*", "class": "not built", "why": "too big"},
]


def _write(tmp_path, doc):
    p = tmp_path / "zoo.json"
    p.write_text(json.dumps(doc))
    return p


def test_counts_and_matrix(tmp_path):
    results = load_zoo_results(_write(tmp_path, {"meta": META, "cells": CELLS}))
    counts = zoo_counts(results)
    assert list(counts["types"]) == list(ZOO_CLASSES)
    assert counts["types"]["ok"] == 1
    assert counts["types"]["refused"] == 1
    assert counts["types"]["not built"] == 1
    assert counts["cells"] == {**dict.fromkeys(ZOO_CLASSES, 0), "ok": 3, "refused": 1}
    page = render_zoo_matrix(results, title="# T")
    rows = [line for line in page.splitlines() if line.startswith("| ") and "|---" not in line]
    names = [
        r.split("|")[1].strip() for r in rows if r.split("|")[1].strip() in {"old", "new", "odd"}
    ]
    assert names == ["new", "old", "odd"]  # newest first, unknown years last
    assert (
        "| old | 2020 | refused | ok | graph: no / pipes |" in page
    )  # a pipe cannot break the row
    assert "| all | 3 | 4 |" in page


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ([], "expected an object"),
        ({"meta": META, "cells": CELLS, "extra": 1}, "expected an object"),
        ({"meta": META, "cells": [{**CELLS[0], "class": "fine"}]}, "unknown class"),
        ({"meta": META, "cells": [{**CELLS[0], "regime": "train"}]}, "unknown regime"),
        ({"meta": {**META, "seconds": float("nan")}, "cells": []}, "finite"),
        ({"meta": {**META, "seconds": -1}, "cells": []}, "finite"),
        ({"meta": META, "cells": [{**CELLS[0], "why": "x" * 5000}]}, "at most"),
        ({"meta": META, "cells": [{**CELLS[0], "year": "2020"}]}, "not an integer"),
        ({"meta": META, "cells": ["cell"]}, "not an object"),
    ],
)
def test_a_hostile_results_file_is_refused(tmp_path, doc, fragment):
    with pytest.raises(ZooResultsError, match=fragment):
        load_zoo_results(_write(tmp_path, doc))


def test_not_json_too_big_and_not_a_file_are_refused(tmp_path):
    p = tmp_path / "zoo.json"
    p.write_bytes(b"\xff{")
    with pytest.raises(ZooResultsError, match="not JSON"):
        load_zoo_results(p)
    with p.open("wb") as fh:
        fh.truncate(8 * 1024 * 1024 + 1)  # sparse: no 8 MiB written
    with pytest.raises(ZooResultsError, match="over"):
        load_zoo_results(p)
    with pytest.raises(ZooResultsError, match="not a regular file"):
        load_zoo_results(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ZooResultsError, match="not a regular file"):
        load_zoo_results(fifo)  # refused without opening it (a fifo would block a read)
