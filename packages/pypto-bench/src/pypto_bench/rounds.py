"""Interleaved rounds: every arm built first, then their timed iterations in A B B A order.

Run one after the other, the arms see different machines: load that starts while the
graph arm runs goes straight into its ratio to eager. Here every requested arm is built
first (warmed, captured or compiled: outside timing, as in the sequential schedule) and
held open at once through :func:`pypto_bench.protocol.arm_iteration`; then round ``r``
runs one timed iteration of every arm, in the requested order when ``r`` is even and
reversed when odd (A B, B A, A B ...). Sample ``r`` of each arm comes from round ``r``,
so the paired ratio of round ``r`` (:mod:`pypto_bench.intervals`) compares iterations
that ran next to each other, and drift slower than a round cancels.

Where it cannot interleave, the run falls back to the sequential schedule and the
report's ``schedule.why`` says why:

* an arm whose open context changes state outside the model's modules (pypto+graph's
  kernel plug-ins: their switches are process-wide; the NPU capture mitigations: eager
  attention, prebuilt masks) cannot stay open while another arm runs: eager would run
  the patched model, and a graph compiled without the switch fails its guards with it.

An arm that patches only the model's modules (the graph arms' exact MoE routing) does
interleave: each arm builds on the model as loaded, and before each of its iterations the
model is put in that arm's state (:mod:`pypto_bench.model_state`: the same module
attributes, not copies), outside the timed span.

In the diffusion regime a round's sample is one whole generation per arm (the graph arms'
capture on their first call, outside the rounds, as in the sequential protocol).

Memory: with every arm built at once, each arm's peaks are those of the process with
all arms held (``schedule.memory`` says so); the sequential schedule gives per-arm peaks.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import Arm, Regime, Schedule
from .intervals import interval, relative_half_width
from .model_state import ModelState, snapshot
from .protocol import Context, Memory, arm_iteration, timed
from .protocol.base import tick
from .protocol.decode import compile_first, decode_sample, fill_decode
from .protocol.diffusion import diffusion_sample
from .protocol.prefill import fill_prefill, prefill_tokens
from .report import ArmResult

__all__ = [
    "INTERLEAVED_REGIMES",
    "MEMORY_NOTE",
    "MIN_TARGET_ROUNDS",
    "Fallback",
    "Round",
    "balanced_order",
    "extend_to_target",
    "model_patch",
    "ratio_widths",
    "run_interleaved",
]

log = logging.getLogger(__name__)

#: The regimes whose arms run in interleaved rounds (every one).
INTERLEAVED_REGIMES = (Regime.DECODE.value, Regime.PREFILL.value, Regime.DIFFUSION.value)

MEMORY_NOTE = (
    "interleaved: every arm is built and held at once, so each arm's memory peaks are the "
    "process's with all arms held (--schedule sequential gives per-arm peaks)"
)

#: --target-ci is judged met from this many rounds on: below it a bootstrap interval can
#: be narrow by chance (three close rounds give a tight [min, max]).
MIN_TARGET_ROUNDS = 6

#: Bootstrap resamples while --target-ci decides whether to add rounds (the report's
#: intervals use the full count).
_CHECK_RESAMPLES = 500


class Fallback(Exception):
    """Interleaving is unsafe for this run; the caller runs the sequential schedule."""


Round = tuple[str, int]


def balanced_order(arms: Sequence[str], rounds: int, *, start: int = 0) -> list[Round]:
    """``[(arm, round), ...]`` for rounds ``start .. start + rounds - 1``: forward order
    in even rounds, reversed in odd ones (A B B A A B ...)."""
    out: list[Round] = []
    for r in range(start, start + rounds):
        names = list(arms) if r % 2 == 0 else list(reversed(arms))
        out += [(name, r) for name in names]
    return out


def model_patch(arm: ArmResult) -> str | None:
    """What ``arm``'s open context changed outside the model's modules, which a module
    state cannot put back (None: nothing, or only module attributes).

    Kernel plug-ins count: besides the modules they swap, they turn their packages'
    switches on (process-wide), so another arm's rounds would run the kernels, and a
    graph compiled with the switches off fails its guards when replayed with them on
    (measured: the attention, GutenOCR and Gemma-4 MoE plug-ins recompiled on replay)."""
    if arm.details.get("plugins"):
        return (
            f"{arm.name} switches kernel plug-ins on ({', '.join(arm.details['plugins'])}), "
            "process-wide: the other arms cannot run between its rounds"
        )
    applied = (arm.details.get("mitigations") or {}).get("applied")
    if applied:
        return f"{arm.name} patches the model for capture ({', '.join(map(str, applied))})"
    return None


def ratio_widths(
    samples: dict[str, list[float]], *, resamples: int = _CHECK_RESAMPLES
) -> list[dict[str, Any]]:
    """Every paired ratio's relative half-width: each arm against eager, and against the
    hf-compile arm where it ran, widest first."""
    out = []
    for base_name, label in ((Arm.EAGER, "x eager"), (Arm.HF_COMPILE, "x hf-compile")):
        base = samples.get(base_name)
        if not base:
            continue
        for name, own in samples.items():
            if name == base_name or not own:
                continue
            got = interval(own, base, resamples=resamples)
            width = relative_half_width(got.to_dict() if got is not None else None)
            if width is not None:
                out.append({"arm": name, "ratio": label, "relative_half_width": width})
    return sorted(out, key=lambda w: -w["relative_half_width"])


@dataclass
class _Built:
    arm: ArmResult
    run: Callable[[], Any]
    mem: Memory
    samples: list[dict[str, Any]] = field(default_factory=list)
    tokens: Any = None
    last: Any = None  # diffusion: the last generation's output, for its figures


def _measure_once(ctx: Context, built: _Built) -> None:
    """One timed iteration of an arm: its sample and tokens."""
    if ctx.config.regime == Regime.DECODE:
        tokens, ttft, dec = built.run()
        built.samples.append(decode_sample(ctx, tokens, ttft, dec))
    elif ctx.config.regime == Regime.DIFFUSION:
        built.last, seconds = timed(ctx.device, built.run)
        built.samples.append(diffusion_sample(ctx, built.last, seconds))
        tokens = None  # the figures and tokens come from the last generation (_fill)
    else:
        out, seconds = timed(ctx.device, built.run)
        tokens = prefill_tokens(out)  # NaN / +inf logits fail the arm
        n = int(ctx.input_ids.numel())
        built.samples.append({"seconds": seconds, "tok_s": n / seconds if seconds > 0 else 0.0})
    built.tokens = tokens
    built.mem.sample()


def _fill(ctx: Context, built: _Built) -> None:
    if ctx.config.regime == Regime.DECODE:
        fill_decode(built.arm, built.samples)
    elif ctx.config.regime == Regime.DIFFUSION:
        runner = built.run.__wrapped__  # type: ignore[attr-defined]  # a DiffusionRun
        built.tokens = runner.finish(built.arm, built.samples, built.last)
    else:
        fill_prefill(ctx, built.arm, [s["seconds"] for s in built.samples])


def _build(
    ctx: Context,
    arm: ArmResult,
    stack: contextlib.ExitStack,
    on_failure: Callable[[ArmResult, BaseException], None],
) -> Callable[[], Any] | None:
    """Open ``arm``'s built iteration on ``stack`` (None: it failed, recorded)."""
    try:
        run, built_s = timed(ctx.device, lambda: stack.enter_context(arm_iteration(ctx, arm)))
        if arm.name not in (Arm.EAGER, Arm.HF_COMPILE):
            # A graph arm's capture (prefill: the build is the capture; decode sets its own).
            arm.details.setdefault("capture_s", built_s)
        why = model_patch(arm)
        if why:
            raise Fallback(why)
        if ctx.config.regime == Regime.DIFFUSION:
            if run.__wrapped__.captures:  # a DiffusionRun
                # Its first generation captures or compiles: capture_s, not a sample.
                _, arm.details["capture_s"] = timed(ctx.device, run)
        elif arm.name == Arm.HF_COMPILE:  # its first call compiles: capture_s, not a sample
            if ctx.config.regime == Regime.DECODE:
                compile_first(ctx, arm, run)
            else:
                _, arm.details["capture_s"] = timed(ctx.device, run)
        return run
    except Fallback:
        raise
    except Exception as err:
        on_failure(arm, err)
        return None


def run_interleaved(
    ctx: Context,
    arms: list[ArmResult],
    on_failure: Callable[[ArmResult, BaseException], None],
    *,
    after: Callable[[ArmResult, Callable[[], Any]], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Build every arm of ``arms`` (one ``ArmResult`` per requested arm, in order), then run
    warmup and timed rounds in balanced order; ``--target-ci`` adds rounds (two at a time,
    so the order stays balanced) until every paired ratio is tight enough or a bound is hit.

    ``after(arm, run)``: called for every ok arm once the rounds are done, its iteration
    still built and the model in its state (what a caller measures beside the timed
    rounds: the multi-rank protocol's outputs and communication profile).

    Returns (tokens per ok arm, the report's ``schedule``). A failing arm goes to
    ``on_failure`` and leaves the rounds; the others go on. Raises :class:`Fallback`
    (nothing measured; the caller runs the sequential schedule) where interleaving is
    unsafe (see the module).
    """
    cfg = ctx.config
    if cfg.regime not in INTERLEAVED_REGIMES:
        raise Fallback(f"the {cfg.regime} regime's arms run one after the other")
    loaded = snapshot(ctx.model)
    with contextlib.ExitStack() as stack:
        stack.callback(loaded.restore)  # last: the model as loaded, whatever ran
        states = _States(ctx.model)
        live: dict[str, _Built] = {}
        for arm in arms:
            loaded.restore()  # every arm builds on the model as loaded
            mem = Memory(ctx.device)  # the build (capture / compile) is its first phase
            run = _build(ctx, arm, stack, on_failure)
            states.built(arm.name)
            # Before the arm's own context closes (LIFO), the model is in its state again.
            stack.callback(states.switch, arm.name)
            if run is not None:
                mem.end_phase("capture")
                live[arm.name] = _Built(arm=arm, run=run, mem=mem)
        names = [a.name for a in arms if a.name in live]
        order: list[Round] = []
        for name, r in balanced_order(names, cfg.warmup):
            states.switch(name)
            _guarded(live, name, lambda b: b.run(), on_failure)
            if name in live:
                tick(ctx, name, r + 1)
        start = time.perf_counter()

        def play(first: int, count: int) -> None:
            for name, r in balanced_order(names, count, start=first):
                if name not in live:
                    continue
                states.switch(name)  # outside the timed span
                _guarded(live, name, lambda b: _measure_once(ctx, b), on_failure)
                if name in live:
                    order.append((name, r))
                    tick(ctx, name, cfg.warmup + r + 1)

        play(0, cfg.iters)
        rounds, target = extend_to_target(
            cfg.target_ci,
            max_iters=cfg.max_iters,
            max_seconds=max(0.0, cfg.max_seconds - (time.perf_counter() - start)),
            rounds=cfg.iters,
            widths=lambda: ratio_widths(
                {n: [s["tok_s"] for s in b.samples] for n, b in live.items()}
            ),
            play=play,
        )
        for name in list(live):
            states.switch(name)
            _guarded(live, name, lambda b: _fill(ctx, b), on_failure)
            if name in live:
                live[name].arm.memory = live[name].mem.result()
                if after is not None:
                    after(live[name].arm, live[name].run)
        tokens = {name: b.tokens for name, b in live.items()}
    schedule: dict[str, Any] = {
        "kind": Schedule.INTERLEAVED.value,
        "requested": cfg.schedule,
        "rounds": rounds,
        "order": [[name, r] for name, r in order],
        "memory": MEMORY_NOTE,
    }
    if target:
        schedule["target_ci"] = target
    return tokens, schedule


class _States:
    """One model state per arm (see :mod:`pypto_bench.model_state`): the arm that runs
    next gets its own back; the one that ran keeps what it changed since."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.saved: dict[str, ModelState] = {}
        self.current: str | None = None

    def built(self, name: str) -> None:
        self.saved[name] = snapshot(self.model)
        self.current = name

    def switch(self, name: str) -> None:
        if name == self.current or name not in self.saved:
            return
        if self.current is not None:
            self.saved[self.current] = snapshot(self.model)
        self.saved[name].restore()
        self.current = name


def _guarded(
    live: dict[str, _Built],
    name: str,
    step: Callable[[_Built], Any],
    on_failure: Callable[[ArmResult, BaseException], None],
) -> None:
    """Run ``step`` on a live arm; a failure records the arm and drops it from the rounds."""
    built = live[name]
    try:
        step(built)
    except Exception as err:
        del live[name]
        on_failure(built.arm, err)


def extend_to_target(
    percent: float | None,
    *,
    max_iters: int,
    max_seconds: float,
    rounds: int,
    widths: Callable[[], list[dict[str, Any]]],
    play: Callable[[int, int], None],
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[int, dict[str, Any] | None]:
    """``--target-ci``: while the widest ratio (``widths()``, widest first: see
    :func:`ratio_widths`) is wider than ``percent`` % of its median, or fewer than
    :data:`MIN_TARGET_ROUNDS` rounds ran, ``play`` two more
    rounds (the order stays balanced), unless that would pass ``max_iters`` rounds or
    ``max_seconds`` have gone since the call. Returns (rounds run in all, the report's
    ``schedule.target_ci``: met, why it stopped, the widest ratio); (rounds, None)
    without a target."""
    if percent is None:
        return rounds, None
    start = clock()
    limit = percent / 100.0
    got = widths()
    stopped = "met"

    def met() -> bool:
        return bool(got) and rounds >= MIN_TARGET_ROUNDS and got[0]["relative_half_width"] <= limit

    while not met():
        if not got:
            stopped = "no ratio to measure (needs eager or hf-compile and another ok arm)"
            break
        if rounds + 2 > max_iters:
            stopped = f"max_iters ({max_iters} rounds)"
            break
        if clock() - start >= max_seconds:
            stopped = f"max_seconds ({max_seconds:g} s)"
            break
        play(rounds, 2)
        rounds += 2
        got = widths()
    done = met()
    log.info("target CI %s%%: met=%s after %d rounds (%s)", percent, done, rounds, stopped)
    return rounds, {
        "percent": percent,
        "met": done,
        "stopped": "met" if done else stopped,
        "rounds": rounds,
        "seconds": clock() - start,
        "widest": got[0] if got else None,
    }
