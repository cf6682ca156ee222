"""``faster / slower / no change`` between two reports, from intervals, never from points.

For every arm both reports ran, and for every ratio (``x eager``; ``x hf-compile`` where
both ran the peer arm), B is judged against A: B's interval entirely above A's is
``faster``, entirely below is ``slower``, overlapping is ``no change``. Intervals come
from the report where it carries them (``arms[].tokens_per_s.interval``,
``arms[].ratio_vs_eager`` / ``ratio_vs_peer``: ``{"median","low","high",...}``),
otherwise (reports before 1.4) from its per-iteration samples through
:func:`pypto_bench.intervals.interval` (the ratio paired by iteration index).

Two reports that measured different things are refused (:class:`CompareMismatchError`,
exit 2) unless the caller names the difference in ``allow_different``:
:data:`FINGERPRINT_FIELDS` lists what is checked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import BadInputError, CompareMismatchError
from .intervals import Interval, interval

__all__ = [
    "FINGERPRINT_FIELDS",
    "Verdicts",
    "arm_intervals",
    "autotune_differences",
    "fingerprint",
    "judge",
    "verdicts",
]

#: What two reports must share to be compared, with ``--allow-different`` names.
FINGERPRINT_FIELDS = ("model", "regime", "shapes", "device", "dtype", "versions")

FASTER, SLOWER, NO_CHANGE = "faster", "slower", "no change"


def _model_fingerprint(data: dict[str, Any]) -> str:
    model = data.get("model") or {}
    if model.get("fingerprint"):
        return str(model["fingerprint"])
    ident = {
        "path": model.get("path") or (data.get("config") or {}).get("model_path"),
        "class": model.get("class"),
        "model_type": model.get("model_type"),
        "parameters": model.get("parameters"),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint(data: dict[str, Any]) -> dict[str, Any]:
    """The environment fingerprint of a report dict: one value per :data:`FINGERPRINT_FIELDS`.

    ``model``: the report's ``model.fingerprint`` when it has one, else a hash of the
    model's path, class, type and parameter count.
    """
    config = data.get("config") or {}
    env = data.get("environment") or {}
    device = env.get("device") or {}
    versions = env.get("versions") or {}
    return {
        "model": _model_fingerprint(data),
        "regime": data.get("regime"),
        "shapes": {
            "batch": config.get("batch"),
            "batches": list(config.get("batches") or []),
            "seq": config.get("seq"),
            "gen": config.get("gen"),
        },
        "device": f"{device.get('type')}:{device.get('name')}",
        "dtype": (data.get("model") or {}).get("dtype") or config.get("dtype"),
        "versions": {k: versions.get(k) for k in ("torch", "transformers")},
    }


def _stat_interval(stats: Any) -> Interval | None:
    if isinstance(stats, dict) and all(
        isinstance(stats.get(k), (int, float)) for k in ("median", "low", "high")
    ):
        return Interval(
            median=float(stats["median"]),
            low=float(stats["low"]),
            high=float(stats["high"]),
            rounds=int(stats.get("rounds") or 0),
            method=str(stats.get("method") or "from the report"),
            level=float(stats.get("level") or 0.95),
        )
    return None


def _samples(arm: dict[str, Any]) -> list[float]:
    return [s for s in (arm.get("tokens_per_s") or {}).get("samples") or [] if s is not None]


def arm_intervals(data: dict[str, Any]) -> dict[str, dict[str, Interval]]:
    """Per ok arm: ``{"tok/s": ..., "x eager": ..., "x hf-compile": ...}`` (where known)."""
    arms = {a["name"]: a for a in data.get("arms") or [] if a.get("ok")}
    out: dict[str, dict[str, Interval]] = {}
    for name, arm in arms.items():
        samples = _samples(arm)
        tps = (arm.get("tokens_per_s") or {}).get("interval")
        entry: dict[str, Interval] = {}
        got = _stat_interval(tps) or interval(samples)
        if got is not None:
            entry["tok/s"] = got
        for key, base_name, label in (
            ("ratio_vs_eager", "eager", "x eager"),
            ("ratio_vs_peer", "hf-compile", "x hf-compile"),
        ):
            if name == base_name or base_name not in arms:
                continue
            ratio = _stat_interval(arm.get(key))
            base = _samples(arms[base_name])
            if ratio is None and samples and base:
                ratio = interval(samples, base)  # paired by iteration (round) index
            if ratio is not None:
                entry[label] = ratio
        out[name] = entry
    return out


def judge(a: Interval, b: Interval) -> str:
    """B against A: ``faster`` (B's interval above A's), ``slower`` (below), ``no change``."""
    if b.low > a.high:
        return FASTER
    if b.high < a.low:
        return SLOWER
    return NO_CHANGE


@dataclass
class Verdicts:
    """B judged against A, one row per (arm, measure)."""

    labels: list[str]
    allowed_differences: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: Why a verdict may reflect something other than noise or the change under test
    #: (the arms compiled different autotuned kernels: :func:`autotune_differences`).
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "labels": self.labels,
            "allowed_differences": self.allowed_differences,
            "differences": self.differences,
            "rows": self.rows,
            "notes": self.notes,
        }

    def to_text(self) -> str:
        lines = [f"B = {self.labels[1]} against A = {self.labels[0]} (95% intervals):"]
        for r in self.rows:
            a, b = r["a"], r["b"]
            lines.append(
                f"  {r['arm']:<12} {r['measure']:<13} {r['verdict']:<9}  "
                f"A {a['median']:.3g} [{a['low']:.3g}, {a['high']:.3g}]  "
                f"B {b['median']:.3g} [{b['low']:.3g}, {b['high']:.3g}]"
            )
        for d in self.differences:
            lines.append(f"  allowed difference: {d}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


def _choices(arm: dict[str, Any]) -> list[tuple[str, str]] | None:
    """(op with shapes, chosen kernel) of an arm's autotuned compile, None if unrecorded."""
    tuned = (arm.get("details") or {}).get("autotune")
    if not isinstance(tuned, dict) or not tuned.get("recorded") or not tuned.get("ops"):
        return None
    out = []
    for op in tuned["ops"]:
        if isinstance(op, dict):
            shapes = op.get("shapes") if isinstance(op.get("shapes"), list) else []
            where = f"{op.get('op')} {shapes[0] if shapes else '?'}x{shapes[-1] if shapes else '?'}"
            out.append((where[:120], str(op.get("kind") or op.get("chosen"))[:120]))
    return out


def autotune_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """One line per arm whose max-autotune compile chose other kernels in ``b`` than in
    ``a`` (both recorded): its ratio then differs by kernel, not only by noise."""
    lines = []
    arms_b = {x.get("name"): x for x in b.get("arms") or [] if isinstance(x, dict)}
    for arm in a.get("arms") or []:
        if not isinstance(arm, dict) or arm.get("name") not in arms_b:
            continue
        ca, cb = _choices(arm), _choices(arms_b[arm["name"]])
        if ca is None or cb is None or ca == cb:
            continue
        changed = [(x, y) for x, y in zip(ca, cb, strict=False) if x != y]
        first = (
            f"e.g. {changed[0][0][0]}: {changed[0][0][1]} vs {changed[0][1][1]}"
            if changed
            else f"{len(ca)} vs {len(cb)} autotuned ops"
        )
        lines.append(
            f"{arm['name']}: the two compiles chose different kernels ({len(changed)} of "
            f"{max(len(ca), len(cb))} autotuned ops; {first[:200]}): its verdicts compare "
            "kernels as well as runs (pin with --compile-mode default, or rerun both)"
        )
    return lines


def _describe(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def verdicts(
    a: dict[str, Any],
    b: dict[str, Any],
    *,
    allow_different: Iterable[str] = (),
    labels: tuple[str, str] = ("A", "B"),
) -> Verdicts:
    """Judge report ``b`` against report ``a`` (both report dicts).

    ``CompareMismatchError`` when they differ in a :data:`FINGERPRINT_FIELDS` entry not
    named in ``allow_different``; ``BadInputError`` on an unknown name there.
    """
    allowed = sorted(set(allow_different))
    unknown = [x for x in allowed if x not in FINGERPRINT_FIELDS]
    if unknown:
        raise BadInputError(
            f"--allow-different {', '.join(unknown)}: unknown; pick from "
            f"{', '.join(FINGERPRINT_FIELDS)}"
        )
    fa, fb = fingerprint(a), fingerprint(b)
    differing = [k for k in FINGERPRINT_FIELDS if fa[k] != fb[k]]
    refused = [k for k in differing if k not in allowed]
    if refused:
        what = "; ".join(f"{k} ({_describe(fa[k])} vs {_describe(fb[k])})" for k in refused)
        raise CompareMismatchError(
            f"refusing to compare reports that measured different things: they differ in "
            f"{what}; pass --allow-different {','.join(refused)} to compare anyway "
            "(or --force to ignore every difference)"
        )
    result = Verdicts(
        labels=list(labels),
        allowed_differences=allowed,
        differences=[f"{k}: {_describe(fa[k])} vs {_describe(fb[k])}" for k in differing],
    )
    result.notes.extend(autotune_differences(a, b))
    ia, ib = arm_intervals(a), arm_intervals(b)
    for arm, measures in ia.items():
        for measure, int_a in measures.items():
            int_b = ib.get(arm, {}).get(measure)
            if int_b is None:
                continue
            result.rows.append(
                {
                    "arm": arm,
                    "measure": measure,
                    "verdict": judge(int_a, int_b),
                    "a": int_a.to_dict(),
                    "b": int_b.to_dict(),
                }
            )
    return result
