"""The decode regime: the time per generated token, prefill excluded.

Eager decode runs HF ``generate``; a logits processor stamps the time (after a
synchronize) when the first logits exist, i.e. right after the prefill forward. Time to
first token = that stamp - start; decode time = end - stamp. The graph arms time
``DecodeStepRunner.prefill`` and ``decode`` separately. Decode tokens = tokens produced
after the first one (which the prefill produced), per row up to and including EOS, summed
over the batch. The hf-compile arm is the eager loop with transformers' recipe.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..config import Arm, BenchConfig, Regime
from ..errors import NonFiniteLogitsError
from ..measure import count_tokens, summarize, summarize_seconds
from ..report import ArmResult
from .base import Context, Memory, RegimeProtocol, mitigation_details, tick, timed
from .peer import peer_generate_kwargs, recipe_scope

__all__ = [
    "DecodeRegime",
    "FirstLogitsStamp",
    "StepStamps",
    "compile_first",
    "decode_sample",
    "eager_generate",
    "fill_decode",
    "generate_logits",
    "graph_decode_iteration",
    "run_decode",
]

log = logging.getLogger(__name__)

#: One decode iteration's answer: (new tokens [B, n], ttft_s, decode_s).
DecodeIteration = Callable[[], tuple[Any, float, float]]


class FirstLogitsStamp:
    """Logits processor that records when the prefill's logits exist (synchronized), and
    whether any step's logits were non-finite.

    Why the second: the argmax of NaN logits is a token too, so a model that computes NaN
    (a NaN ``rms_norm_eps``, an fp16 overflow) "matched" its own other arms token for token.
    The flag is a device tensor or-ed each step (no host sync in the loop), read once after
    the generate.
    """

    def __init__(self, device: Any, synchronize: Callable[[Any], None]) -> None:
        self.device = device
        self.synchronize = synchronize
        self.stamp: float | None = None
        self.nonfinite: Any = None
        import torch

        self._fp32 = torch.float32

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.stamp is None:
            self.synchronize(self.device)
            self.stamp = time.perf_counter()
        # One reduction per step, on the device, no sync: the fp32 sum is NaN when any score
        # is NaN (or +inf beside -inf) and +inf when any is +inf; -inf alone, a processor's
        # mask (min_new_tokens bans EOS that way), leaves it -inf or finite.
        total = scores.sum(dtype=self._fp32)
        bad = total.isnan() | total.isposinf()
        self.nonfinite = bad if self.nonfinite is None else self.nonfinite | bad
        return scores


def _generate_kwargs(ctx: Context, processors: Any, extra: dict[str, Any] | None) -> dict[str, Any]:
    """The greedy ``generate`` call of this run (timed and untimed passes alike)."""
    cfg = ctx.config
    kwargs: dict[str, Any] = {
        "input_ids": ctx.input_ids,
        "attention_mask": ctx.attention_mask,
        "do_sample": False,
        "max_new_tokens": cfg.gen,
        "logits_processor": processors,
        "pad_token_id": ctx.pad_id,
    }
    if cfg.ignore_eos:
        kwargs["min_new_tokens"] = cfg.gen
    kwargs.update(extra or {})
    return kwargs


def eager_generate(ctx: Context, extra: dict[str, Any] | None = None) -> tuple[Any, float, float]:
    """One greedy generate: (new tokens [B, n], ttft_s, decode_s).

    ``extra`` adds generate keywords: the hf-compile arm's static cache and CompileConfig,
    so that arm is timed by exactly this code.
    """
    import torch
    from transformers import LogitsProcessorList

    from pypto_capture import synchronize

    stamp = FirstLogitsStamp(ctx.device, synchronize)
    kwargs = _generate_kwargs(ctx, LogitsProcessorList([stamp]), extra)
    with torch.inference_mode():
        synchronize(ctx.device)
        start = time.perf_counter()
        out = ctx.model.generate(**kwargs)
        synchronize(ctx.device)
        end = time.perf_counter()
    assert stamp.stamp is not None
    if stamp.nonfinite is not None and bool(stamp.nonfinite):
        raise NonFiniteLogitsError(
            "the logits hold NaN or +inf (non-finite logits fail an arm, always: their argmax "
            "is no answer); check the config's numbers (e.g. rms_norm_eps) and the dtype "
            "(float16 overflows where bfloat16 does not)"
        )
    return out[:, ctx.input_ids.shape[1] :], stamp.stamp - start, end - stamp.stamp


class StepStamps:
    """Logits processor that stamps every step, the device synchronized (per-token latency
    of an untimed pass: the time between consecutive steps' logits)."""

    def __init__(self, device: Any, synchronize: Callable[[Any], None]) -> None:
        self.device = device
        self.synchronize = synchronize
        self.stamps: list[float] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.synchronize(self.device)
        self.stamps.append(time.perf_counter())
        return scores

    def step_seconds(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]


def generate_logits(
    ctx: Context, extra: dict[str, Any] | None = None, step_times: list[float] | None = None
) -> tuple[Any, Any]:
    """One greedy generate, untimed, with its raw logits: (tokens [B, n], logits [B, n, V]).

    The numerical gate's reference (the eager arm's own path, so its tokens are the eager
    arm's) and the hf-compile arm's logits (``extra``: its recipe). Raw logits, before any
    processor (``min_new_tokens`` masks EOS in the processed scores). ``step_times``
    receives the seconds between consecutive steps, the device synchronized.
    """
    import torch
    from transformers import LogitsProcessorList

    from pypto_capture import synchronize

    stamps = StepStamps(ctx.device, synchronize)
    kwargs = _generate_kwargs(ctx, LogitsProcessorList([stamps]), extra)
    kwargs.update(output_logits=True, return_dict_in_generate=True)
    with torch.inference_mode():
        out = ctx.model.generate(**kwargs)
    if step_times is not None:
        step_times.extend(stamps.step_seconds())
    tokens = out.sequences[:, ctx.input_ids.shape[1] :]
    return tokens, torch.stack(list(out.logits), dim=1)


def decode_sample(ctx: Context, tokens: Any, ttft: float, decode_s: float) -> dict[str, Any]:
    """One iteration's figures: tokens per row, decode tokens, ttft, decode time, tok/s."""
    counts = count_tokens(tokens, ctx.eos_ids, ignore_eos=ctx.config.ignore_eos)
    decode_tokens = sum(max(0, c - 1) for c in counts)
    return {
        "counts": counts,
        "decode_tokens": decode_tokens,
        "ttft_s": ttft,
        "decode_s": decode_s,
        "tok_s": decode_tokens / decode_s if decode_s > 0 and decode_tokens else 0.0,
    }


def graph_decode_iteration(ctx: Context, arm: ArmResult) -> DecodeIteration:
    """Build the decode runner, capture its step, and return one measured iteration.

    The iteration is what the graph arm times (and what pypto-tune profiles): reset,
    prefill (timed apart), then ``gen - 1`` replays of the captured step.
    """
    import torch

    from pypto_capture import DecodeStepRunner, synchronize

    cfg = ctx.config
    dtype = next(ctx.model.parameters()).dtype
    runner = DecodeStepRunner(
        ctx.model,
        batch_size=cfg.batch,
        max_cache_len=cfg.seq + cfg.gen,
        backend=ctx.graph_backend or cfg.graph_backend,
        device=ctx.device,
        dtype=dtype,
        compile_mode=None if ctx.graph_backend is not None else cfg.compile_mode,
    )
    arm.details["backend"] = str(getattr(runner, "backend_name", cfg.graph_backend))
    arm.details["mitigations"] = mitigation_details(
        runner.mitigations, runner.backend.name, getattr(ctx.device, "type", str(ctx.device))
    )
    if getattr(runner, "compile_mode_reason", None):
        # None = inductor's default; on CPU large models get autotuned GEMVs by default.
        arm.details["compile_mode"] = {
            "mode": runner.compile_mode,
            "why": runner.compile_mode_reason,
        }

    def once() -> tuple[Any, float, float]:
        runner.reset()
        first, ttft = timed(ctx.device, lambda: runner.prefill(ctx.input_ids, ctx.attention_mask))
        rest, dec = timed(ctx.device, lambda: runner.decode(first, cfg.gen - 1))
        return torch.cat([first.reshape(-1, 1), rest], dim=1), ttft, dec

    def forced(tokens: Any, prompt: Any = None, step_times: list[float] | None = None) -> Any:
        """Teacher-forced logits after ``prompt`` (default: the run's own prompt, same shape)."""
        with torch.inference_mode():
            if prompt is None:
                return runner.forced_logits(ctx.input_ids, ctx.attention_mask, tokens, step_times)
            return runner.forced_logits(prompt, torch.ones_like(prompt), tokens, step_times)

    # The numerical gate's view of this arm (pypto_bench.numerics): the captured step's
    # logits, teacher-forced with the reference's tokens.
    once.forced_logits = forced  # type: ignore[attr-defined]

    with torch.inference_mode():
        runner.reset()
        runner.prefill(ctx.input_ids, ctx.attention_mask)
        synchronize(ctx.device)
        start = time.perf_counter()
        runner.capture()
        synchronize(ctx.device)
        arm.details["capture_s"] = time.perf_counter() - start
        # Final after capture: auto's fused backend may have fallen back to a plain capture.
        arm.details["backend"] = str(getattr(runner, "backend_name", cfg.graph_backend))
        wrapper = getattr(getattr(runner, "backend", None), "wrapper", None)
        if wrapper:  # inductor's C++ or Python wrapper around the kernels (pypto_capture)
            arm.details["inductor_wrapper"] = wrapper
        wrapper_fallback = getattr(getattr(runner, "backend", None), "wrapper_fallback", None)
        if wrapper_fallback:
            arm.warnings.append(f"{arm.name}: {wrapper_fallback}")
        reason = getattr(getattr(runner, "backend", None), "fallback_reason", None)
        if reason:
            arm.warnings.append(f"{arm.name}: {reason}")
        tuned = getattr(getattr(runner, "backend", None), "autotune", None)
        if tuned is not None:
            # What max-autotune chose while compiling (pypto_capture.autotune): a choice
            # timed under this machine's load, so two runs' ratios can differ by kernel.
            arm.details["autotune"] = tuned
        describe = getattr(getattr(runner, "cache", None), "describe", None)
        if callable(describe):
            # The layer-type pattern and per-layer slots (sliding layers hold `window`,
            # full layers max_cache_len): on CPU the allocator peak is 0, so this is the
            # cache's memory figure, and its bytes are what each graph step reads.
            arm.details["kv_cache"] = describe()
        runner.reset()
    return once


def fill_decode(arm: ArmResult, samples: list[dict[str, Any]]) -> None:
    """The arm's figures from its samples (``decode_sample``)."""
    arm.tokens_per_s = summarize([s["tok_s"] for s in samples])
    arm.seconds = summarize_seconds([s["decode_s"] for s in samples])
    arm.ttft_s = summarize_seconds([s["ttft_s"] for s in samples])
    arm.tokens_per_iter = [s["decode_tokens"] for s in samples]
    arm.details["tokens_per_row"] = samples[-1]["counts"]
    arm.details["generated_tokens_per_iter"] = [sum(s["counts"]) for s in samples]


@contextlib.contextmanager
def _arm_iteration(ctx: Context, arm: ArmResult) -> Iterator[DecodeIteration]:
    """The arm dispatch of this regime, written once (timed run and session alike)."""
    if arm.name == Arm.EAGER:
        yield lambda: eager_generate(ctx)
    elif arm.name == Arm.HF_COMPILE:
        with recipe_scope(ctx):
            extra = peer_generate_kwargs(ctx, arm)

            def once() -> tuple[Any, float, float]:
                return eager_generate(ctx, extra)

            # The numerical gate's view of this arm (pypto_bench.numerics): its own
            # generate with the raw logits (transformers' generate takes no forced tokens).
            once.free_logits = lambda step_times=None: generate_logits(  # type: ignore[attr-defined]
                ctx, extra, step_times
            )
            yield once
    else:
        yield graph_decode_iteration(ctx, arm)


def compile_first(ctx: Context, arm: ArmResult, once: DecodeIteration) -> None:
    """The hf-compile arm's first call compiles (untimed as a sample: ``capture_s``)."""
    from ..peer import used_compiled_call

    _, arm.details["capture_s"] = timed(ctx.device, once)
    arm.details["compiled"] = used_compiled_call(ctx.model)
    if not arm.details["compiled"]:
        msg = f"{arm.name}: generate did not take its compiled path (ran uncompiled)"
        log.warning(msg)
        arm.warnings.append(msg)


def run_decode(
    ctx: Context,
    arm: ArmResult,
    mem: Memory,
    keep: dict[str, Any] | None = None,
    after: Callable[[ArmResult, Any], None] | None = None,
) -> Any:
    """Warmup and timed iterations of ``arm.name`` in the decode regime; its last tokens.

    ``keep`` receives the iteration function (``keep["once"]``): ``--nproc`` ranks run
    one more, untimed, under the profiler to measure the time in collectives. ``after(arm,
    once)`` runs once the timed iterations are done, the arm still built (the numerical
    gate's teacher-forced pass).
    """
    import torch

    cfg = ctx.config
    with _arm_iteration(ctx, arm) as once:
        if keep is not None:
            keep["once"] = once
        if arm.name == Arm.HF_COMPILE:
            compile_first(ctx, arm, once)
        mem.end_phase("capture")  # the graph arms capture on entry, hf-compile compiled above
        with torch.inference_mode():
            for i in range(cfg.warmup):
                once()
                tick(ctx, arm.name, i + 1)
            samples = []
            tokens = None
            for i in range(cfg.iters):
                tokens, ttft, dec = once()
                samples.append(decode_sample(ctx, tokens, ttft, dec))
                mem.sample()
                tick(ctx, arm.name, cfg.warmup + i + 1)
        if after is not None:
            after(arm, once)
    fill_decode(arm, samples)
    return tokens


class DecodeRegime(RegimeProtocol):
    """``--regime decode`` (see the module)."""

    regime = Regime.DECODE.value

    def run(
        self,
        ctx: Context,
        arm: ArmResult,
        mem: Memory,
        keep: dict[str, Any] | None = None,
        after: Callable[[ArmResult, Any], None] | None = None,
    ) -> Any:
        return run_decode(ctx, arm, mem, keep, after)

    def iteration(
        self, ctx: Context, arm: ArmResult
    ) -> contextlib.AbstractContextManager[DecodeIteration]:
        """Eager: one ``generate`` (its first forward is the prefill); the graph arms a
        prefill plus ``gen - 1`` captured steps (capture happens before the yield)."""
        return _arm_iteration(ctx, arm)

    def reference(self, ctx: Context) -> Any:
        return eager_generate(ctx)[0]

    def produced(self, ctx: Context, tokens: Any) -> list[int]:
        # Generated tokens are compared up to each row's EOS.
        return count_tokens(tokens, ctx.eos_ids)

    def moe_token_counts(self, config: BenchConfig) -> tuple[int, ...]:
        return (config.batch,)
