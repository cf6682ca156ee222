"""The diffusion-generate regime: one whole generation per iteration.

eager: the model's own generation, uncaptured. graph arms: a protocol model that captures
its own step gets a pypto-capture backend; another protocol model a captured
whole-sequence forward; a transformers block-diffusion class its own static-cache
``generate`` with one denoising step captured (:mod:`pypto_bench.diffusion`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..config import Arm, BenchConfig, Regime
from ..measure import count_tokens, summarize, summarize_seconds
from ..report import ArmResult
from .base import Context, Memory, RegimeProtocol, tick, timed

__all__ = [
    "DiffusionRegime",
    "DiffusionRun",
    "diffusion_call",
    "diffusion_plan",
    "diffusion_sample",
    "graph_forward",
    "run_diffusion",
]


def diffusion_call(ctx: Context, plan: dict[str, Any]) -> Any:
    """One generation; ``plan`` holds the arm's keywords (``forward``, ``step_backend``,
    ``native_step``), empty for the eager arm.

    The torch RNG is seeded with ``--seed`` first: a native block-diffusion model samples
    (random canvases, multinomial draws), and every arm and iteration starting from the
    same state is what makes its tokens comparable with the eager arm's.
    """
    import torch

    from ..diffusion import diffusion_generate

    cfg = ctx.config
    torch.manual_seed(cfg.seed)
    steps = cfg.effective_diffusion_steps
    assert steps is not None  # the diffusion regime always has steps
    return diffusion_generate(
        ctx.model,
        ctx.input_ids,
        gen_length=cfg.gen,
        steps=steps,
        block_length=cfg.block_length,
        ignore_eos=cfg.ignore_eos,
        **plan,
    )


def diffusion_plan(ctx: Context, arm: ArmResult) -> dict[str, Any]:
    """How the arm drives the model (``details.diffusion.path`` reports which path ran):
    the arm dispatch of this regime, written once.

    eager: the model's own generation, uncaptured. graph: a protocol model that captures its
    own step gets a pypto-capture backend (``step_backend``); another protocol model gets a
    captured whole-sequence forward (``forward``); a transformers block-diffusion class runs
    its own static-cache ``generate`` with one denoising step captured by the backend
    (``native_step``, :class:`pypto_bench.diffusion.CapturedDenoiserStep`).
    """
    from ..diffusion import CapturedDenoiserStep, captures_own_step, native_block_diffusion

    if arm.name == Arm.EAGER:
        return {}
    if native_block_diffusion(ctx.model) and not captures_own_step(ctx.model):
        from pypto_capture import make_backend

        _refuse_past_the_window(ctx)

        # freezing off: transformers marks the static cache's tensors as static addresses,
        # and inductor's freezing (the CPU compile default) then folds them into constants,
        # so the step would read the cache as it was at capture (measured on the tiny
        # DiffusionGemma: tokens match eager on the first canvas only, 86% overall).
        backend = make_backend(
            ctx.config.graph_backend,
            ctx.device,
            compile_mode=ctx.config.compile_mode,
            freezing=False,
        )
        step = CapturedDenoiserStep(ctx.model, backend)
        arm.details["backend"] = step.backend_name
        return {"native_step": step}
    if captures_own_step(ctx.model):
        from pypto_capture import make_backend

        backend = make_backend(
            ctx.config.graph_backend, ctx.device, compile_mode=ctx.config.compile_mode
        )
        arm.details["backend"] = backend.name
        return {"step_backend": backend}
    return {"forward": graph_forward(ctx)}


def _refuse_past_the_window(ctx: Context) -> None:
    """The graph arm of a native block-diffusion model runs transformers' static-cache
    ``generate``; past the sliding window that path computes other tokens than the model's
    own (dynamic-cache) ``generate``, with no capture involved: DiffusionGemma, window 8,
    16 + 32 tokens: 62.5% of tokens agree between the two uncaptured generates (59.4% for
    the graph arm against eager, which was reported as a speedup with a warning). Refused
    in one line rather than measured: a ratio of an arm that computes something else."""
    from ..errors import RegimeNotSupportedError

    text = ctx.model.config.get_text_config()
    window = getattr(text, "sliding_window", None)
    types = set(getattr(text, "layer_types", None) or [])
    span = ctx.config.seq + ctx.config.gen
    if window and (not types or "sliding_attention" in types) and span > int(window):
        raise RegimeNotSupportedError(
            f"{type(ctx.model).__name__}: --seq {ctx.config.seq} + --gen {ctx.config.gen} = "
            f"{span} tokens pass its sliding window ({window}), where transformers' static-"
            "cache generate (what the graph arm captures) computes other tokens than its own "
            f"generate: keep --seq + --gen <= {window} for the graph arm"
        )


def diffusion_sample(ctx: Context, out: Any, seconds: float) -> dict[str, Any]:
    """Per-iteration figures: tokens over generated positions up to EOS, NFE, forwards."""
    from ..diffusion import count_generated

    cfg = ctx.config
    mask_id = getattr(ctx.model.config, "mask_token_id", None)
    counts = count_generated(
        out.sequences,
        cfg.seq,
        ctx.eos_ids,
        unfilled_ids=[mask_id] if mask_id is not None else [],
        ignore_eos=cfg.ignore_eos,
        gen_length=cfg.gen,
    )
    tokens = sum(counts)
    nfe = out.num_denoising_steps
    return {
        "counts": counts,
        "tokens": tokens,
        "seconds": seconds,
        "nfe": nfe,
        "forwards": out.num_forward_passes if out.num_forward_passes is not None else nfe,
        "tok_s": tokens / seconds if seconds > 0 else 0.0,
        "tpf": tokens / nfe if nfe else None,
        "fps": nfe / seconds if nfe and seconds > 0 else None,
    }


class DiffusionRun:
    """One arm's generation, built once (its plan: see :func:`diffusion_plan`) and called
    once per iteration (inference mode, the RNG seeded); :meth:`finish` turns the
    iterations' samples into the arm's figures. The sequential protocol
    (:func:`run_diffusion`) and the interleaved rounds (:mod:`pypto_bench.rounds`) both
    drive an arm through it."""

    def __init__(self, ctx: Context, arm: ArmResult) -> None:
        self.ctx = ctx
        self.plan = diffusion_plan(ctx, arm)
        self.calls = {"n": 0}
        if "forward" in self.plan:
            inner = self.plan["forward"]
            arm.details["backend"] = getattr(inner, "backend_name", None)

            def counted(ids: Any) -> Any:
                self.calls["n"] += 1
                return inner(ids)

            self.plan["forward"] = counted

    @property
    def captures(self) -> bool:
        """Whether the first call compiles or captures (kept outside timing)."""
        return bool(self.plan)

    def __call__(self) -> Any:
        import torch

        with torch.inference_mode():
            return diffusion_call(self.ctx, self.plan)

    def finish(self, arm: ArmResult, samples: list[dict[str, Any]], out: Any) -> Any:
        """Fill ``arm`` from the timed ``samples`` (``out``: the last generation's output);
        the generated tokens of the last generation."""
        from ..diffusion import native_block_diffusion

        cfg, plan = self.ctx.config, self.plan
        seqs = out.sequences
        native = native_block_diffusion(self.ctx.model) and "step_backend" not in plan
        rows, width = tuple(seqs.shape)
        expected = cfg.seq + cfg.gen
        if rows != cfg.batch or (width != expected if not native else width < expected):
            raise RuntimeError(
                f"diffusion generation returned sequences of shape {tuple(seqs.shape)}, "
                f"expected ({cfg.batch}, {expected}{' or more' if native else ''})"
            )
        arm.tokens_per_s = summarize([s["tok_s"] for s in samples])
        arm.seconds = summarize_seconds([s["seconds"] for s in samples])
        arm.tokens_per_iter = [s["tokens"] for s in samples]
        arm.details["num_denoising_steps"] = out.num_denoising_steps
        arm.details["diffusion"] = {
            "path": out.path or _default_path(plan, self.calls),
            "tokens_per_forward": summarize([s["tpf"] for s in samples if s["tpf"] is not None]),
            "forwards_per_s": summarize([s["fps"] for s in samples if s["fps"] is not None]),
            "denoising_steps_per_iter": [s["nfe"] for s in samples],
            "forward_passes_per_iter": [s["forwards"] for s in samples],
            "steps_per_block": out.steps_per_block,
            "tokens_per_row": samples[-1]["counts"],
            "logits_finite": out.logits_finite,
        }
        if out.logits_finite is False:
            arm.warnings.append(f"{arm.name}: the model produced non-finite logits (NaN/Inf)")
        if "forward" in plan:
            arm.details["forward_used"] = self.calls["n"] > 0
        if "native_step" in plan:
            # What the capture cost bought: one step, replayed for every step of every canvas.
            arm.details["diffusion"]["capture"] = plan["native_step"].describe()
        if native:
            # Sampled, not greedy: the token match is between draws from the same seed.
            arm.details["diffusion"]["token_match_basis"] = (
                f"sampled tokens, torch RNG seeded with {cfg.seed} before every generation"
            )
        return seqs[:, cfg.seq :]


def run_diffusion(
    ctx: Context, arm: ArmResult, mem: Memory, after: Callable[..., None] | None = None
) -> Any:
    """Warmup and timed generations of ``arm.name``; the generated tokens of the last.
    ``after(arm, run)``: called once the timed generations are done, the arm still built
    (the numerical gate's denoiser check)."""
    cfg = ctx.config
    run = DiffusionRun(ctx, arm)
    samples: list[dict[str, Any]] = []
    out: Any = None
    if run.captures:  # compile/capture outside timing, like the decode runner
        _, arm.details["capture_s"] = timed(ctx.device, run)
        mem.end_phase("capture")
    for i in range(cfg.warmup):
        run()
        tick(ctx, arm.name, i + 1)
    for i in range(cfg.iters):
        out, seconds = timed(ctx.device, run)
        samples.append(diffusion_sample(ctx, out, seconds))
        mem.sample()
        tick(ctx, arm.name, cfg.warmup + i + 1)
    tokens = run.finish(arm, samples, out)
    if after is not None:
        after(arm, run)
    return tokens


def _default_path(plan: dict[str, Any], calls: dict[str, int]) -> str:
    """The path of a protocol model that does not name its own."""
    if "forward" in plan:
        used = "used" if calls["n"] else "ignored by the model"
        return f"diffusion_generate with a captured whole-sequence forward ({used})"
    return "diffusion_generate (the model's own loop)"


def graph_forward(ctx: Context) -> Callable[[Any], Any]:
    """A captured whole-sequence forward for the diffusion graph arm.

    Every denoising step runs the same [B, prompt+gen] shape, so one capture serves them
    all: ids are copied into a static buffer and pypto-capture's backend (npugraph,
    cudagraph, compile or eager, as for decode) replays the captured forward. The
    returned logits live in the graph's static output: the model must consume them
    before its next forward call, which a denoising loop does.
    """
    import torch

    from pypto_capture import STEP_MARKER, make_backend

    cfg = ctx.config
    backend = make_backend(cfg.graph_backend, ctx.device)
    model = ctx.model
    static_ids = torch.zeros(cfg.batch, cfg.seq + cfg.gen, dtype=torch.long, device=ctx.device)
    state: dict[str, Any] = {}

    def step() -> Any:
        return model(input_ids=static_ids, use_cache=False).logits

    def forward(ids: Any) -> Any:
        if tuple(ids.shape) != tuple(static_ids.shape):
            raise RuntimeError(
                f"diffusion forward called with shape {tuple(ids.shape)}, captured {tuple(static_ids.shape)}"
            )
        static_ids.copy_(ids)
        if "step" not in state:
            state["step"] = backend.capture(step, warmup=1)
        if torch.autograd._profiler_enabled():
            # Under a profiler each replay is one named step (pypto-tune's unit).
            with torch.profiler.record_function(STEP_MARKER):
                return state["step"].replay()
        return state["step"].replay()

    forward.backend_name = backend.name  # type: ignore[attr-defined]
    return forward


@contextlib.contextmanager
def _arm_iteration(ctx: Context, arm: ArmResult) -> Iterator[Callable[[], Any]]:
    yield DiffusionRun(ctx, arm)


class DiffusionRegime(RegimeProtocol):
    """``--regime diffusion-generate`` (see the module)."""

    regime = Regime.DIFFUSION.value

    def run(
        self, ctx: Context, arm: ArmResult, mem: Memory, after: Callable[..., None] | None = None
    ) -> Any:
        return run_diffusion(ctx, arm, mem, after)

    def iteration(
        self, ctx: Context, arm: ArmResult
    ) -> contextlib.AbstractContextManager[Callable[[], Any]]:
        """One generation (the arm's plan built, its capture on the first call)."""
        return _arm_iteration(ctx, arm)

    def reference(self, ctx: Context) -> Any:
        import torch

        with torch.inference_mode():
            return diffusion_call(ctx, {}).sequences[:, ctx.config.seq :]

    def produced(self, ctx: Context, tokens: Any) -> list[int]:
        # Every generated position up to EOS (with --ignore-eos: every position).
        return count_tokens(tokens, ctx.eos_ids, ignore_eos=ctx.config.ignore_eos)

    def moe_token_counts(self, config: BenchConfig) -> tuple[int, ...]:
        # Full-prefix recompute sees the whole sequence; a block-cached step (LLaDA2's
        # captured step) sees one block per row (32 when --block-length is unset).
        return (
            config.batch * (config.seq + config.gen),
            config.batch * (config.block_length or 32),
        )
