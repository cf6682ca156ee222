"""Before/after: operator- and block-level diff of two profiles, and whether the
baseline's predictions came true.

A recommendation counts as applied when the optimised profile's settings satisfy its
``applies_when`` (e.g. the graph arm ran), or when the caller names it. The verdict is
the factor between predicted and measured speedup (1.0 = exact); within
``tolerance`` (default 2x) the prediction "came true".
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from pypto_bench.intervals import unpaired_ratio

from .errors import BadInputError, NotComparableError
from .records import Profile, not_a_profile
from .summary import op_time

__all__ = [
    "BAND_METHOD",
    "NO_SAMPLES",
    "compare_profiles",
    "comparison_markdown",
    "step_noise",
]

#: Why a comparison carries no interval.
NO_SAMPLES = (
    "a profile holds only the step's totals (no per-step samples, written before "
    "step.time_us.samples existed): no interval can be formed; re-profile both"
)
#: How a block's or operator's delta is judged: they hold per-step means only.
BAND_METHOD = (
    "blocks and operators hold per-step means only: a delta inside the step time's noise "
    "band (the interval's half-width, in us) is within noise"
)


def _samples(p: Profile) -> list[float]:
    got = (p.step.get("time_us") or {}).get("samples") or []
    return [float(v) for v in got if isinstance(v, (int, float)) and math.isfinite(v)]


def _verdict(low: float, high: float) -> str:
    """From an interval of opt/base *time*: below 1 throughout is faster."""
    if high < 1.0:
        return "faster"
    if low > 1.0:
        return "slower"
    return "within noise"


def step_noise(base: Profile, opt: Profile, *, seed: int = 0) -> dict[str, Any]:
    """The step time's opt/base ratio with its interval (unpaired bootstrap of the ratio
    of medians over the profiled steps: the two profiles ran apart, so no step pairs
    with another) and the verdict ``faster / slower / within noise``; without samples
    in both (or fewer than two steps in either), ``verdict`` is None and ``why`` says so."""
    b, o = _samples(base), _samples(opt)
    if len(b) < 2 or len(o) < 2:
        why = NO_SAMPLES if not (b and o) else "fewer than two profiled steps: no interval"
        return {"time_ratio": None, "verdict": None, "band_us": None, "why": why}
    got = unpaired_ratio(o, b, seed=seed)
    if got is None:
        return {"time_ratio": None, "verdict": None, "band_us": None, "why": NO_SAMPLES}
    base_med = statistics.median(b)
    return {
        "time_ratio": got.to_dict(),
        "verdict": _verdict(got.low, got.high),
        "band_us": (got.high - got.low) / 2 * base_med,
        "band_method": BAND_METHOD,
        "why": None,
    }


def _delta_verdict(delta_us: float, band_us: float | None) -> str | None:
    if band_us is None:
        return None
    if abs(delta_us) <= band_us:
        return "within noise"
    return "faster" if delta_us < 0 else "slower"


#: What must match for two profiles to be compared (the arm and settings may differ).
_SAME = ("regime", "batch", "seq", "gen")
#: ...and what they ran on: a speedup across devices or dtypes is not the fix's.
_SAME_RUN = (("device_type", "device"), ("dtype", "dtype"))


def _model_id(p: Profile) -> tuple[Any, Any]:
    model = p.meta.get("model") or {}
    return model.get("class"), model.get("parameters")


def _applied(rec: dict[str, Any], opt: Profile) -> bool:
    cond = rec.get("applies_when") or {}
    if "arm" in cond:
        return opt.meta.get("arm") in cond["arm"]
    if "attn_implementation" in cond:
        cfg = opt.meta.get("bench_config") or {}
        return cfg.get("attn_implementation") == cond["attn_implementation"]
    return False


def compare_profiles(
    base: Profile,
    opt: Profile,
    *,
    applied: list[str] | None = None,
    tolerance: float = 2.0,
    top: int = 10,
    allow_different: bool = False,
) -> dict[str, Any]:
    """The diff and the prediction check; raises NotComparableError for different runs
    (model, regime, shapes, device type or dtype) and ``TypeError`` for arguments that
    are not profiles."""
    for name, value in (("base", base), ("opt", opt)):
        if not isinstance(value, Profile):
            raise TypeError(not_a_profile("compare_profiles", name, value))
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 1):
        raise BadInputError(f"tolerance must be a finite factor >= 1 (e.g. 2), got {tolerance!r}")
    for key in _SAME:
        if base.meta.get(key) != opt.meta.get(key):
            raise NotComparableError(
                f"the profiles differ in {key} ({base.meta.get(key)!r} vs {opt.meta.get(key)!r}): "
                "profile both with the same --regime/--batch/--seq/--gen"
            )
    units = (base.step.get("unit"), opt.step.get("unit"))
    if units[0] != units[1]:
        raise NotComparableError(
            f"the profiles' steps are different units ({units[0]!r} vs {units[1]!r}): "
            "a per-forward profile cannot be compared with a per-iteration one"
        )
    for key, flag in _SAME_RUN:
        if base.meta.get(key) != opt.meta.get(key):
            raise NotComparableError(
                f"the profiles ran on different {key.replace('_type', 's')} "
                f"({base.meta.get(key)!r} vs {opt.meta.get(key)!r}): profile both with the "
                f"same --{flag}"
            )
    different = _model_id(base) != _model_id(opt)
    same_weights = _model_id(base)[1] is not None and _model_id(base)[1] == _model_id(opt)[1]
    if different and not (allow_different and same_weights):
        hint = (
            " (same parameter count: the same weights pinned to other modeling code? pass "
            "--allow-different)"
            if same_weights
            else ""
        )
        raise NotComparableError(
            f"the profiles are of different models ({_model_id(base)} vs {_model_id(opt)}): "
            f"compare two profiles of the same model folder{hint}"
        )
    b_us, o_us = base.step_us, opt.step_us
    noise = step_noise(base, opt)
    ratio = noise.get("time_ratio")
    if ratio and ratio.get("median"):
        # The headline from the statistic its interval is of (medians of the step samples):
        # a ratio of means printed beside an interval of medians read "0.72x [0.74, 22.20]".
        speedup: float | None = 1.0 / float(ratio["median"])
        speedup_of = "median step times"
    else:
        speedup = b_us / o_us if o_us else None
        speedup_of = "mean step times (no per-step samples)"
    band = noise["band_us"]
    blocks = {}
    for name in sorted(set(base.blocks) | set(opt.blocks)):
        bb = base.blocks.get(name, {}).get("us", 0.0)
        oo = opt.blocks.get(name, {}).get("us", 0.0)
        blocks[name] = {
            "base_us": bb,
            "opt_us": oo,
            "delta_us": oo - bb,
            "verdict": _delta_verdict(oo - bb, band),
        }

    from .outputs import layer_times

    lb, lo = layer_times(base), layer_times(opt)
    layers = {
        str(k): {
            "base_us": lb.get(k, 0.0),
            "opt_us": lo.get(k, 0.0),
            "delta_us": lo.get(k, 0.0) - lb.get(k, 0.0),
            "verdict": _delta_verdict(lo.get(k, 0.0) - lb.get(k, 0.0), band),
        }
        for k in sorted(set(lb) | set(lo))
    }

    def by_op(p: Profile) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = defaultdict(float)
        dev = str(p.meta.get("device_type") or "cpu")
        for o in p.ops:
            out[(o.name, o.block)] += op_time(o, dev)
        return out

    bo, oo_ = by_op(base), by_op(opt)
    ops: list[dict[str, Any]] = []
    for n, blk in set(bo) | set(oo_):
        before, after = bo.get((n, blk), 0.0), oo_.get((n, blk), 0.0)
        ops.append(
            {
                "name": n,
                "block": blk,
                "base_us": before,
                "opt_us": after,
                "delta_us": after - before,
                "verdict": _delta_verdict(after - before, band),
            }
        )
    ops.sort(key=lambda o: abs(float(o["delta_us"])), reverse=True)

    named = set(applied or [])
    checks = []
    for rec in base.recommendations:
        if not (rec.get("id") in named or (not named and _applied(rec, opt))):
            continue
        pred = rec.get("estimated_speedup")
        check: dict[str, Any] = {
            "id": rec.get("id"),
            "title": rec.get("title"),
            "predicted": pred,
            "measured": speedup,
        }
        if pred and speedup:
            factor = max(pred / speedup, speedup / pred)
            check["factor"] = factor
            check["came_true"] = factor <= tolerance
        else:
            check["factor"] = None
            check["came_true"] = None
        checks.append(check)
    if named - {c["id"] for c in checks}:
        missing = ", ".join(sorted(named - {c["id"] for c in checks}))
        raise NotComparableError(
            f"the baseline has no recommendation {missing}: pick an id from `pypto-tune advise BASE`"
        )
    return {
        "base": {"arm": base.meta.get("arm"), "step_us": b_us},
        "opt": {"arm": opt.meta.get("arm"), "step_us": o_us},
        "step_speedup": speedup,
        "step_speedup_of": speedup_of,
        "models": {
            "base": list(_model_id(base)),
            "opt": list(_model_id(opt)),
            "allowed_different": bool(different),
        },
        "noise": noise,
        "blocks": blocks,
        "layers": layers,
        "attribution": {
            "base": _attribution_status(base),
            "opt": _attribution_status(opt),
        },
        "ops": ops[:top],
        "predictions": checks,
        "tolerance": tolerance,
    }


def _attribution_status(p: Profile) -> str:
    """How a profile's operators got their blocks (a graph arm's: attributed or not)."""
    a = p.meta.get("attribution")
    if not isinstance(a, dict):
        return "module scopes" if p.meta.get("arm") == "eager" else "not attributed"
    why = " ".join(str(a.get("why")).split())[:200]
    return "attributed" if a.get("status") == "ok" else f"not attributed ({why})"


def _noise_line(noise: dict[str, Any] | None) -> str:
    if not noise or noise.get("verdict") is None:
        return f"Noise: {(noise or {}).get('why') or NO_SAMPLES}"
    r = noise["time_ratio"]
    return (
        f"Noise: opt/base step time {r['median']:.3f} [{r['low']:.3f}, {r['high']:.3f}] "
        f"({r['level']:.0%}, {r['method']}): **{noise['verdict']}**; blocks and operators "
        f"within +/-{noise['band_us']:.1f} us are within noise"
    )


def _speedup_interval(noise: dict[str, Any] | None) -> str:
    """`` [low, high]``: the speedup's 95% interval (the inverse of the step-time ratio's),
    or a note that the profiles kept too few steps for one."""
    r = (noise or {}).get("time_ratio")
    if not r or not r.get("low") or not r.get("high"):
        return " (no interval: see Noise)"
    return f" [{1 / r['high']:.2f}, {1 / r['low']:.2f}]"


def comparison_markdown(c: dict[str, Any]) -> str:
    def v(row: dict[str, Any]) -> str:
        return row.get("verdict") or "no interval"

    lines = [
        "# pypto-tune compare",
        "",
        f"Step: {c['base']['step_us']:.1f} us ({c['base']['arm']}) -> {c['opt']['step_us']:.1f} us "
        f"({c['opt']['arm']}): {c['step_speedup']:.2f}x{_speedup_interval(c.get('noise'))}"
        if c["step_speedup"]
        else "Step: n/a",
        "",
        _noise_line(c.get("noise")),
        "",
        "| block | base us | opt us | delta | verdict |",
        "|---|---:|---:|---:|---|",
    ]
    for name, b in c["blocks"].items():
        lines.append(
            f"| {name} | {b['base_us']:.1f} | {b['opt_us']:.1f} | {b['delta_us']:+.1f} | {v(b)} |"
        )
    att = c.get("attribution") or {}
    if any(str(v).startswith("not attributed") for v in att.values()):
        lines += [
            "",
            f"Blocks: base {att.get('base')}, opt {att.get('opt')}: a `captured` block holds "
            "a step whose operators have no module, so per-block deltas against it are not "
            "like for like.",
        ]
    if c.get("layers"):
        lines += [
            "",
            "| layer | base us | opt us | delta | verdict |",
            "|---|---:|---:|---:|---|",
        ]
        for name, b in c["layers"].items():
            lines.append(
                f"| {name} | {b['base_us']:.1f} | {b['opt_us']:.1f} | {b['delta_us']:+.1f} "
                f"| {v(b)} |"
            )
    lines += [
        "",
        "| operator | block | base us | opt us | delta | verdict |",
        "|---|---|---:|---:|---:|---|",
    ]
    for o in c["ops"]:
        lines.append(
            f"| `{o['name']}` | {o['block']} | {o['base_us']:.1f} | {o['opt_us']:.1f} "
            f"| {o['delta_us']:+.1f} | {v(o)} |"
        )
    lines += ["", "## Predictions", ""]
    if not c["predictions"]:
        lines.append("No baseline recommendation was applied in the optimised profile.")
    for p in c["predictions"]:
        verdict = {True: "came true", False: "missed", None: "not estimated"}[p["came_true"]]
        pred = f"{p['predicted']:.2f}x" if p["predicted"] else "-"
        meas = f"{p['measured']:.2f}x" if p["measured"] else "-"
        factor = f" (within {p['factor']:.2f}x)" if p.get("factor") else ""
        lines.append(f"- {p['id']}: predicted {pred}, measured {meas}: {verdict}{factor}")
    return "\n".join(lines) + "\n"
