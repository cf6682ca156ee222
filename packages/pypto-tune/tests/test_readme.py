"""The README's threshold and exit-code tables are the code's (checked, not copied)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from pypto_tune import EXIT, Thresholds

README = (Path(__file__).parents[1] / "README.md").read_text()


def test_every_threshold_is_documented_with_its_default():
    rows = dict(re.findall(r"^\| `(\w+)` \| ([\d.]+) \|", README, re.M))
    defaults = Thresholds()
    for f in fields(Thresholds):
        assert f.name in rows, f"README lacks threshold {f.name}"
        assert float(rows[f.name]) == getattr(defaults, f.name), f.name


def test_exit_code_table_matches():
    rows = re.findall(r"^\| (\d+) \| (\w+) \|", README, re.M)
    assert [(int(c), n) for c, n in rows] == [(e.code, e.name) for e in EXIT]
