"""Compare a target dump with a reference dump, entry by entry, and name the first module
that diverges.

Entries are aligned by ``(module name, call, input/output, index)``. Each shared entry gets
its metrics (pypto_precision.metrics) and a verdict (pypto_precision.rule), judged against
the noise floor when a floor dump is given (the target's dtype on the reference device).

The *first diverging module* is the earliest output, in the target's execution order, that
fails the rule: outputs arrive children before parents, so a wrong MLP in layer 3 is named
as ``model.layers.3.mlp`` (its own output fails first), not as the final norm whose error
is merely the largest. With inputs recorded, a module whose own input already fails is
passed over for the module that called it (the numbers went wrong in the caller's code
between its children). The largest error is reported too, separately.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .dump import Entry
from .errors import NotComparableError
from .metrics import stats_metrics, tensor_metrics
from .reader import Dump
from .rule import Rule, Verdict

__all__ = ["Comparison", "Row", "compare_dumps"]

log = logging.getLogger(__name__)


@dataclass
class Row:
    """One aligned entry: where it is, what it measured, and its verdict."""

    id: str
    module: str
    io: str
    order: int
    shape: list[int]
    dtype: str
    reference_dtype: str
    metrics: dict[str, Any]
    verdict: Verdict

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "module": self.module, "io": self.io, "order": self.order,
            "shape": self.shape, "dtype": self.dtype, "reference_dtype": self.reference_dtype,
            "metrics": self.metrics, "verdict": self.verdict.to_dict(),
        }  # fmt: skip


@dataclass
class Comparison:
    """The whole compare: every row, the first divergence, and what it was judged with."""

    target: dict[str, Any]
    reference: dict[str, Any]
    floor: dict[str, Any] | None
    rule: Rule
    metric: str
    rows: list[Row]
    only_in_target: list[str] = field(default_factory=list)
    only_in_reference: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if not r.verdict.ok]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def first_divergent(self) -> Row | None:
        """The earliest failing output in execution order (else the earliest failing row).

        When inputs were recorded and that module's own input already fails, it was fed
        wrong numbers rather than making them: they were made by the code that called it
        between its children (a rotary embedding computed inline in an attention block, a
        residual add in a decoder layer), so the calling module is named instead."""
        outputs = [r for r in self.failed if r.io == "output"]
        pool = outputs or self.failed
        if not pool:
            return None
        first = min(pool, key=lambda r: r.order)
        return self._caller_if_fed_wrong(first) if first.io == "output" else first

    def _caller_if_fed_wrong(self, row: Row) -> Row:
        fed_wrong = any(
            r.io == "input" and r.module == row.module and r.order < row.order for r in self.failed
        )
        name = row.module.rsplit("#", 1)[0]
        if not fed_wrong or "." not in name:
            return row
        caller = name.rsplit(".", 1)[0]
        later = [
            r for r in self.failed
            if r.io == "output" and r.order > row.order and r.module.rsplit("#", 1)[0] == caller
        ]  # fmt: skip
        return min(later, key=lambda r: r.order) if later else row

    @property
    def worst(self) -> Row | None:
        """The row with the largest error relative to what it was allowed."""

        def ratio(r: Row) -> float:
            v, a = r.verdict.value, r.verdict.allowed
            if v is None:
                return float("inf")
            return v / a if a else (float("inf") if v else 0.0)

        return max(self.rows, key=ratio) if self.rows else None

    def to_dict(self) -> dict[str, Any]:
        first, worst = self.first_divergent, self.worst
        return {
            "format": "pypto-precision-compare",
            "version": 1,
            "ok": self.ok,
            "metric": self.metric,
            "rule": self.rule.to_dict(),
            "target": self.target,
            "reference": self.reference,
            "floor": self.floor,
            "entries": len(self.rows),
            "failed": len(self.failed),
            "first_divergent": first.to_dict() if first else None,
            "worst": worst.to_dict() if worst else None,
            "only_in_target": self.only_in_target[:100],
            "only_in_reference": self.only_in_reference[:100],
            "rows": [r.to_dict() for r in self.rows],
        }


def _describe(dump: Dump) -> dict[str, Any]:
    meta = dump.meta
    return {
        "folder": str(dump.folder), "source": dump.source, "mode": dump.mode,
        "device": meta.get("device"), "dtype": meta.get("dtype"), "arm": meta.get("arm"),
        "model": meta.get("model"), "entries": len(dump.entries),
    }  # fmt: skip


def _metrics(
    target: Dump, t: Entry, reference: Dump, r: Entry, use_tensors: bool
) -> dict[str, Any]:
    if t.shape != r.shape:
        return {"shape_mismatch": f"{t.shape} vs {r.shape}", "nonfinite_mismatch": 0}
    if use_tensors:
        return tensor_metrics(target.tensor(t), reference.tensor(r))
    return stats_metrics(t.stats, r.stats)


def compare_dumps(
    target: Dump,
    reference: Dump,
    *,
    floor: Dump | None = None,
    rule: Rule | None = None,
) -> Comparison:
    """Compare ``target`` with ``reference`` (the trusted run); ``floor``: the target's
    dtype on the reference device, the error that dtype is entitled to."""
    rule = rule or Rule()
    _same_inputs(target, reference, "the reference")
    if floor is not None:
        _same_inputs(floor, reference, "the floor's reference")
    sides = [target, reference] + ([floor] if floor is not None else [])
    use_tensors = all(d.has_tensors() for d in sides)
    metric = "rel_l2" if use_tensors else "norm_rel"
    if not use_tensors and any(d.has_tensors() for d in sides):
        log.warning("one side holds statistics only: comparing statistics (norms)")
    by_id = {e.id: e for e in reference.entries}
    floor_by_id = {e.id: e for e in floor.entries} if floor is not None else {}
    shared = [e for e in target.entries if e.id in by_id]
    if not shared:
        raise NotComparableError(
            f"{target.folder} and {reference.folder} share no entry (module name, call, io): "
            "dump the same model's code on both sides"
        )
    rows: list[Row] = []
    for t in shared:
        r = by_id[t.id]
        m = _metrics(target, t, reference, r, use_tensors)
        floor_value = None
        f = floor_by_id.get(t.id)
        if f is not None and f.shape == r.shape:
            assert floor is not None
            if use_tensors:
                fm = tensor_metrics(floor.tensor(f), reference.tensor(r))
            else:
                fm = stats_metrics(f.stats, r.stats)
            floor_value = fm.get(metric)
            m["floor_" + metric] = floor_value
        if "shape_mismatch" in m:
            verdict = Verdict(
                False, "shape", None, None, None, f"shapes differ: {m['shape_mismatch']}"
            )
        else:
            verdict = rule.judge(metric, m.get(metric), t.dtype, floor_value,
                                 int(m.get("nonfinite_mismatch") or 0))  # fmt: skip
        rows.append(Row(t.id, t.module, t.io, t.order, t.shape, t.dtype, r.dtype, m, verdict))
    return Comparison(
        target=_describe(target),
        reference=_describe(reference),
        floor=_describe(floor) if floor is not None else None,
        rule=rule,
        metric=metric,
        rows=rows,
        only_in_target=_missing(target.entries, by_id),
        only_in_reference=_missing(reference.entries, {e.id: e for e in target.entries}),
    )


def _missing(entries: Iterable[Entry], other: dict[str, Entry]) -> list[str]:
    return [e.id for e in entries if e.id not in other]


def _same_inputs(a: Dump, b: Dump, what: str) -> None:
    ia, ib = a.meta.get("input_ids"), b.meta.get("input_ids")
    if ia is not None and ib is not None and ia != ib:
        raise NotComparableError(
            f"{a.folder} was run on other token ids than {what} ({b.folder}): dump both with "
            "the same --prompt/--seq and seed"
        )
