"""The noise guard: say when a run's timing verdicts cannot be trusted, and why.

A run on a busy machine once reported eager best 7.6 tok/s with median 1.2, a graph arm
at 0.19x eager and an eager roofline share of 198% (the bandwidth probe ran while other
jobs held the cores), with no warning. Four conditions are checked after every run:

* ``spread``: an arm's tok/s samples disagree (best far above the median, or a large
  stdev relative to the median): the typical iteration is not what the headline says;
* ``roofline``: an arm beats the measured ceiling (share > 100%): the ceiling was measured
  while something else held the cores, or the formula does not fit this model;
* ``interval``: an arm's paired-ratio 95% interval (``ratio_vs_eager`` /
  ``ratio_vs_peer``, pypto_bench.intervals) is wider than +-25% of its median: the rounds
  disagree too much for the ratio to say anything;
* ``load``: other processes used a large share of the machine's cores during the run
  (machine busy time from /proc/stat minus this process's own and its children's, so
  compile workers are not "other"; elsewhere the 1-minute load average per core).

When any holds, the report's ``noise`` section lists each check (measured value,
threshold, verdict), the affected arms get ``unreliable`` (which verdicts, why) and the
suggestion names what to do. Thresholds live in :data:`THRESHOLDS` (one place).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .config import Arm
from .intervals import relative_half_width

__all__ = [
    "OWN_PROCESS_METHOD",
    "SUGGESTION",
    "THRESHOLDS",
    "LoadSampler",
    "NoiseThresholds",
    "assess",
    "guard",
    "noise_section",
    "summary",
]


@dataclass(frozen=True)
class NoiseThresholds:
    """Above these a verdict is unreliable. Chosen so ordinary jitter (a few % between
    iterations, a CI neighbour's short bursts) stays below and a contended run does not."""

    #: best tok/s / median tok/s of one arm (2 samples: one iteration 3x the other).
    best_over_median: float = 1.5
    #: stdev / median of one arm's tok/s samples (coefficient of variation); checked
    #: from ``min_samples_for_stdev`` samples on (with two, stdev is only their range).
    stdev_over_median: float = 0.5
    min_samples_for_stdev: int = 3
    #: measured tok/s / roofline ceiling: above 1.0 the ceiling itself is wrong.
    roofline_share: float = 1.0
    #: relative half-width of an arm's paired-ratio 95% interval (``ratio_vs_eager`` /
    #: ``ratio_vs_peer``: (high - low) / 2 / median); checked from
    #: ``min_samples_for_stdev`` rounds on. Above it the ratio is +-25% or worse.
    ratio_ci_half_width: float = 0.25
    #: share of all cores' time used by other processes during the run.
    other_load: float = 0.5
    #: 1-minute load average per core (fallback without /proc/stat; includes this run).
    loadavg_per_core: float = 1.5


THRESHOLDS = NoiseThresholds()

SUGGESTION = (
    "rerun with more iterations (--iters 10), on a quiet machine (stop other jobs), and "
    "with threads pinned (e.g. taskset -c 0-{last} with OMP_NUM_THREADS={n})"
)

#: The verdict names an ``unreliable`` entry lists (the table columns they mark).
TOK_S, RATIO, ROOFLINE = "tok/s", "x eager", "roofline %"


def _suggestion() -> str:
    n = os.cpu_count() or 1
    return SUGGESTION.format(last=n - 1, n=n)


# --- machine load ---------------------------------------------------------------------


def _proc_stat() -> tuple[int, int] | None:
    """(busy, total) jiffies over all cores since boot, or None where /proc/stat is absent."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            first = fh.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu" or len(first) < 8:
        return None
    v = [int(x) for x in first[1:]]
    user, nice, system, idle, iowait, irq, softirq = v[:7]
    steal = v[7] if len(v) > 7 else 0
    busy = user + nice + system + irq + softirq + steal  # guest time is inside user
    return busy, busy + idle + iowait


def _stat_fields(pid: str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces: split after the last ")".
    return text[text.rfind(")") + 2 :].split()


def _own_jiffies() -> int | None:
    """CPU jiffies of this process (all threads), its reaped children and its live
    descendants (inductor's compile workers, their compilers): work this run asked for."""
    me = str(os.getpid())
    own = _stat_fields(me)
    if own is None:
        return None
    parent: dict[str, str] = {}
    cpu: dict[str, int] = {}
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        pids = []
    for pid in pids:
        f = _stat_fields(pid)
        if f is None or len(f) < 15:
            continue
        parent[pid] = f[1]
        cpu[pid] = sum(int(x) for x in f[11:15])  # utime stime cutime cstime
    total = sum(int(x) for x in own[11:15])
    for pid in cpu:
        if pid == me:
            continue
        p, hops = parent.get(pid), 0
        while p and p not in ("0", "1", me) and hops < 64:
            p, hops = parent.get(p), hops + 1
        if p == me:
            total += cpu[pid]
    return total


#: How ``LoadSampler`` counts this run's own CPU time by default.
OWN_PROCESS_METHOD = (
    "/proc/stat busy jiffies minus this process's and its descendants' "
    "(utime+stime+cutime+cstime), over all cores' jiffies"
)


class LoadSampler:
    """How much of the machine other processes used between construction and ``stop``.

    ``own_jiffies`` counts the run's own CPU time (default: this process and its
    descendants; ``--nproc`` passes its launcher's process group) and ``method`` says so
    in the report.
    """

    def __init__(
        self,
        own_jiffies: Callable[[], int | None] | None = None,
        method: str = OWN_PROCESS_METHOD,
    ) -> None:
        self._own_fn = own_jiffies or _own_jiffies
        self._method = method
        self._stat = _proc_stat()
        self._own = self._own_fn() if self._stat is not None else None
        self._t0 = time.monotonic()

    def stop(self) -> dict[str, Any]:
        """``other_share`` (0-1 of all cores; None without /proc), ``loadavg_1m``,
        ``cpu_count``, ``seconds`` and ``method``."""
        stat = _proc_stat()
        own = self._own_fn() if stat is not None else None
        out: dict[str, Any] = {
            "seconds": time.monotonic() - self._t0,
            "cpu_count": os.cpu_count(),
            "loadavg_1m": _loadavg(),
            "other_share": None,
            "own_share": None,
        }
        if stat and self._stat and own is not None and self._own is not None:
            total = stat[1] - self._stat[1]
            if total > 0:
                busy = stat[0] - self._stat[0]
                mine = max(0, own - self._own)
                out["other_share"] = min(1.0, max(0.0, (busy - mine) / total))
                out["own_share"] = min(1.0, mine / total)
                out["method"] = self._method
                return out
        out["method"] = "os.getloadavg() 1-minute average per core (includes this run)"
        return out


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


# --- assessment -----------------------------------------------------------------------


def _check(
    name: str, where: str, measure: str, value: float | None, threshold: float
) -> dict[str, Any]:
    return {
        "name": name,
        "where": where,
        "measure": measure,
        "value": value,
        "threshold": threshold,
        "holds": value is not None and value > threshold,
    }


def assess(
    arms: list[Any],
    load: dict[str, Any] | None,
    *,
    where: str = "",
    thresholds: NoiseThresholds = THRESHOLDS,
) -> list[dict[str, Any]]:
    """Evaluate the conditions on one run's arms (``ArmResult``s) and mark the affected
    ones' ``unreliable``; return every check made (held or not).

    ``where`` prefixes each check's location (``"batch 8 / "`` in a sweep). ``load`` is
    ``LoadSampler.stop()`` for the run (None: not sampled).
    """
    checks: list[dict[str, Any]] = []
    marks: dict[str, dict[str, list[str]]] = {a.name: {} for a in arms}

    def mark(arm: str, verdicts: tuple[str, ...], why: str) -> None:
        for v in verdicts:
            marks[arm].setdefault(v, [])
            if why not in marks[arm][v]:
                marks[arm][v].append(why)

    ok_arms = [a for a in arms if a.ok and a.tokens_per_s.get("best")]
    for arm in ok_arms:
        tps = arm.tokens_per_s
        median, best, stdev = tps.get("median"), tps.get("best"), tps.get("stdev")
        ratio = best / median if median else None
        enough = len(tps.get("samples") or []) >= thresholds.min_samples_for_stdev
        cv = stdev / median if (median and stdev is not None and enough) else None
        for c in (
            _check(
                "spread",
                f"{where}{arm.name}",
                "best / median tok/s",
                ratio,
                thresholds.best_over_median,
            ),
            _check(
                "spread",
                f"{where}{arm.name}",
                "stdev / median tok/s",
                cv,
                thresholds.stdev_over_median,
            ),
        ):
            checks.append(c)
            if c["holds"]:
                why = (
                    f"{arm.name} tok/s spread: {c['measure']} {c['value']:.2f} > "
                    f"{c['threshold']:g} (samples {', '.join(f'{s:.1f}' for s in tps['samples'])})"
                )
                mark(arm.name, (TOK_S, RATIO, ROOFLINE), why)
                if arm.name == Arm.EAGER:  # the baseline of every other arm's ratio
                    for other in ok_arms:
                        mark(other.name, (RATIO,), why)
    for arm in ok_arms:
        for key, label in (("ratio_vs_eager", "x eager"), ("ratio_vs_peer", "x hf-compile")):
            ci = getattr(arm, key, None)
            if not ci or (ci.get("rounds") or 0) < thresholds.min_samples_for_stdev:
                continue
            c = _check(
                "interval",
                f"{where}{arm.name}",
                f"{label} 95% interval half-width / median",
                relative_half_width(ci),
                thresholds.ratio_ci_half_width,
            )
            checks.append(c)
            if c["holds"]:
                why = (
                    f"{arm.name} {label} interval [{ci['low']:.2f}, {ci['high']:.2f}] is "
                    f"+-{c['value']:.0%} of its median {ci['median']:.2f} > "
                    f"+-{c['threshold']:.0%}"
                )
                mark(arm.name, (RATIO,), why)
    for arm in ok_arms:
        share = (arm.roofline or {}).get("fraction_of_ceiling")
        c = _check(
            "roofline",
            f"{where}{arm.name}",
            "measured tok/s / ceiling",
            share,
            thresholds.roofline_share,
        )
        checks.append(c)
        if c["holds"]:
            why = (
                f"{arm.name} runs at {share:.0%} of the roofline ceiling: the ceiling was "
                "measured while something else held the cores, or its formula does not fit "
                "this model"
            )
            for other in ok_arms:  # one measured ceiling serves every arm
                mark(other.name, (ROOFLINE,), why)
    if load is not None:
        checks.append(_load_check(load, where, thresholds))
        if checks[-1]["holds"]:
            c = checks[-1]
            why = f"machine load: {c['measure']} {c['value']:.2f} > {c['threshold']:g}"
            for arm in ok_arms:
                mark(arm.name, (TOK_S, RATIO, ROOFLINE), why)
    for arm in arms:
        got = marks.get(arm.name) or {}
        if got:
            reasons: list[str] = []
            for whys in got.values():
                reasons += [w for w in whys if w not in reasons]
            arm.unreliable = {"verdicts": list(got), "why": "; ".join(reasons)}
    return checks


def _load_check(load: dict[str, Any], where: str, thresholds: NoiseThresholds) -> dict[str, Any]:
    run = where.rstrip(" /") or "run"
    if load.get("other_share") is not None:
        return _check(
            "load",
            run,
            "share of all cores used by other processes",
            load["other_share"],
            thresholds.other_load,
        )
    avg, n = load.get("loadavg_1m"), load.get("cpu_count") or 1
    return _check(
        "load",
        run,
        "1-minute load average per core",
        avg / n if avg is not None else None,
        thresholds.loadavg_per_core,
    )


def noise_section(
    checks: list[dict[str, Any]],
    load: dict[str, Any] | None,
    thresholds: NoiseThresholds = THRESHOLDS,
) -> dict[str, Any]:
    """The report's ``noise`` section from ``assess``'s checks."""
    held = [c for c in checks if c["holds"]]
    return {
        "noisy": bool(held),
        "held": [f"{c['name']} at {c['where']}" for c in held],
        "checks": checks,
        "load": load,
        "thresholds": asdict(thresholds),
        "suggestion": _suggestion() if held else None,
    }


def summary(noise: dict[str, Any] | None) -> str | None:
    """One line for a noisy report (console, compare), None for a clean one."""
    if not noise or not noise.get("noisy"):
        return None
    held = [c for c in noise.get("checks", []) if c.get("holds")]
    parts = [
        f"{c['name']} at {c['where']} ({c['measure']} {_num(c.get('value'))} > {c['threshold']:g})"
        for c in held
    ]
    text = "noisy run: " + "; ".join(parts)
    if noise.get("suggestion"):
        text += f"; {noise['suggestion']}"
    return text


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"


def guard(
    report: Any,
    load: dict[str, Any] | None,
    *,
    batches: Sequence[tuple[int, Any]] | None = None,
    baselines: Sequence[Any] = (),
) -> str | None:
    """Assess a finished run and fill ``report.noise``; the one-line summary (also added
    to ``report.warnings``) when the run is noisy, else None. The caller logs it.

    ``batches``: a sweep's ``(batch, Report)`` pairs (default: ``report`` alone); each
    batch's arms are assessed, the machine load once. ``baselines``: a multi-rank run's
    1-rank baseline arms: assessed without the load (it was sampled over both runs), and
    a noisy one marks its arm's scaling efficiency untrustworthy
    (``details.scaling_unreliable``).
    """
    runs = list(batches) if batches is not None else [(0, report)]
    checks: list[dict[str, Any]] = []
    for batch, run in runs:
        where = f"batch {batch} / " if len(runs) > 1 else ""
        got = assess(run.arms, load, where=where)
        if any(c["name"] == "load" for c in checks):
            got = [c for c in got if c["name"] != "load"]
        checks += got
    if baselines:
        checks += assess(list(baselines), None, where="1-rank baseline / ")
    report.noise = noise_section(checks, load)
    for base in baselines:
        if base.unreliable:
            why = f"1-rank {base.name} baseline: {base.unreliable['why']}"
            for arm in report.arms:
                if arm.name == base.name:
                    arm.details["scaling_unreliable"] = why
    line = summary(report.noise)
    if line:
        report.warnings.append(line)
    return line
