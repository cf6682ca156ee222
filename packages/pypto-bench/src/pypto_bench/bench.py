"""``run_bench``: one model, one regime, several arms, one report.

Timing rules every arm follows (the point of this package):

* the same regime, the same inputs, the same ``warmup`` and ``iters`` for every arm;
  each measured iteration is one sample, and every arm reports all samples plus best,
  median, mean and stdev;
* each timed span starts and ends with a device synchronize;
* decode excludes prefill. Eager decode runs HF ``generate``; a logits processor stamps
  the time (after a synchronize) when the first logits exist, i.e. right after the
  prefill forward. Time to first token = that stamp - start; decode time = end - stamp.
  The graph arms time ``DecodeStepRunner.prefill`` and ``decode`` separately. Decode
  tokens = tokens produced after the first one (which the prefill produced), per row up
  to and including EOS, summed over the batch;
* memory peaks are reset before each arm; model load is reported on its own.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pypto_common import redact

from . import noise
from .distributed import DEFAULT_RANK_TIMEOUT
from .errors import (
    BadInputError,
    RegimeNotSupportedError,
)
from .measure import (
    RssPeak,
    attention_flops_per_token,
    cache_bytes_probe,
    count_tokens,
    kv_bytes_per_token,
    match_rate,
    measure_bandwidth,
    measure_matmul_peak,
    roofline,
    summarize,
    summarize_seconds,
    weight_bytes_read_per_step,
)
from .noise import LoadSampler
from .peer import PEER_ARM
from .report import ArmResult, Report, check_report_path, new_report, underlying_error

log = logging.getLogger(__name__)

REGIMES = ("prefill", "decode", "diffusion-generate")
#: ``hf-compile`` is transformers' own static-cache + torch.compile recipe (pypto_bench.peer):
#: the fast path a user would pick instead of this project, measured by the same protocol.
ARMS = ("eager", "graph", "pypto+graph", PEER_ARM)
#: Regimes the peer recipe exists in (transformers has no diffusion generate to compile).
PEER_REGIMES = ("decode", "prefill")
GRAPH_BACKENDS = ("auto", "compile", "cudagraph", "npugraph", "fused", "eager")
#: How the graph arms run an MoE model's experts (pypto_capture.MOE_ROUTINGS, spelled here
#: so building the CLI parser does not import torch).
MOE_ROUTINGS = ("exact", "static")

#: What the report says about an arm whose outputs are not the model's on purpose.
STATIC_MOE_NOTE = (
    "--moe-routing static: every token goes to fixed experts (a throughput proxy), so its "
    "tokens are not the model's; no token match is computed"
)

ProgressFn = Callable[[str, int, int], None]

# Prompt text the synthetic inputs are cut from: natural text keeps byte-level and BPE
# tokenizers in their ordinary regime; rows start at different offsets so a batch is
# not B copies of one sequence.
_PROMPT_TEXT = (
    "The history of computing is a story of machines that learned to remember, to "
    "calculate and finally to converse. Early engineers wired logic by hand; later "
    "generations wrote compilers, operating systems and networks that span the world. "
    "Today a single accelerator multiplies matrices faster than a room of mainframes, "
    "and the bottleneck is often memory: every generated word reads the model's weights "
    "once more from high-bandwidth memory into the compute units. "
)


@dataclass
class BenchConfig:
    """Everything a run depends on; defaults match the seed harness.

    ``model_path`` has no environment default: the library reads no environment
    variable behind its caller's back (pypto-e2e fingerprints this config, and a hidden
    ``MODEL_PATH`` would make two identical-looking configs differ). The ``pypto-bench``
    CLI uses ``$MODEL_PATH`` as the default of ``--model-path``.
    """

    model_path: str | None = None
    device: str = "0"
    regime: str = "decode"
    seq: int = 16
    gen: int = 128
    batch: int = 1
    # The batch sweep (``--batch 1,8,32``): every batch measured in one run, the model
    # loaded once; ``batch`` is its first entry (the report's headline arms). Empty: one
    # batch, ``batch``.
    batches: tuple[int, ...] = ()
    arms: tuple[str, ...] = ("eager", "graph")
    warmup: int = 2
    iters: int = 3
    dtype: str = "auto"
    graph_backend: str = "auto"
    # torch.compile mode of the compile/fused backends: None lets pypto-capture choose
    # (decode on CPU: "max-autotune-no-cudagraphs" for models with >= 256 MiB of weights,
    # which reaches the bandwidth ceiling; inductor's default otherwise).
    compile_mode: str | None = None
    seed: int = 0
    attn_implementation: str | None = None
    trust_remote_code: bool = False
    ignore_eos: bool = False
    diffusion_steps: int | None = None
    block_length: int | None = None
    report_file: str | None = None
    measure_bandwidth: bool = True
    # MoE models only: "exact" (the model's routing, capture-safe: pypto_capture.
    # apply_exact_moe) or "static" (the seed's fixed-expert proxy; outputs differ by design).
    moe_routing: str = "exact"
    # Ranks (pypto_bench.distributed): 1 is the single-process run; N > 1 launches N ranks
    # with torch's elastic launcher, the model sharded by its tensor-parallel plan.
    nproc: int = 1
    # --nproc > 1: seconds without progress on any rank before the run is ended as hung.
    rank_timeout: float = DEFAULT_RANK_TIMEOUT
    # --nproc > 1: run the whole model on one device first (the speedup's and the agreement's
    # reference). False (--no-baseline), or a model that does not fit one device: skipped.
    nproc_baseline: bool = True
    # --nproc > 1: "tensor" (each rank a shard of every layer, the family's TP plan) or
    # "pipeline" (one process, layers split over the devices; prefill, eager: the fallback
    # for a family without a plan).
    placement: str = "tensor"
    # A vision-language model's prefill on an image + text prompt (``--image FILE``): the
    # whole model, vision tower included, on inputs the folder's processor builds. None:
    # text prompts (a VL model's language model). pypto_bench.vision reads the file.
    image: str | None = None
    command_line: list[str] | None = None

    def validate(self) -> None:
        """Reject bad requests before anything is loaded or written."""
        from .loading import DTYPES

        if self.regime not in REGIMES:
            raise BadInputError(
                f"unknown regime {self.regime!r}: choose one of {', '.join(REGIMES)}"
            )
        arms = tuple(self.arms)
        if not arms:
            raise BadInputError(
                "no arms requested: pass --arms eager,graph (any of eager, graph, pypto+graph)"
            )
        for arm in arms:
            if arm not in ARMS:
                raise BadInputError(f"unknown arm {arm!r}: choose from {', '.join(ARMS)}")
        if len(set(arms)) != len(arms):
            raise BadInputError(f"arm listed twice in {','.join(arms)}: list each arm once")
        if PEER_ARM in arms and self.regime not in PEER_REGIMES:
            raise BadInputError(
                f"the {PEER_ARM} arm runs in the {' and '.join(PEER_REGIMES)} regimes only "
                f"(transformers has no compiled {self.regime} path): drop it from --arms"
            )
        if self.gen < 1:
            raise BadInputError(f"--gen must be >= 1 (got {self.gen})")
        if self.regime == "decode" and self.gen < 2:
            raise BadInputError(
                "the decode regime needs --gen >= 2 (the first token comes from prefill)"
            )
        for name in ("seq", "batch", "iters"):
            if getattr(self, name) < 1:
                raise BadInputError(f"--{name} must be >= 1 (got {getattr(self, name)})")
        if self.warmup < 0:
            raise BadInputError(f"--warmup must be >= 0 (got {self.warmup})")
        self._validate_batches()
        if self.dtype not in DTYPES:
            raise BadInputError(f"unknown dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.graph_backend not in GRAPH_BACKENDS:
            raise BadInputError(
                f"unknown graph backend {self.graph_backend!r}: choose one of {', '.join(GRAPH_BACKENDS)}"
            )
        if self.moe_routing not in MOE_ROUTINGS:
            raise BadInputError(
                f"unknown MoE routing {self.moe_routing!r}: choose one of {', '.join(MOE_ROUTINGS)}"
            )
        if (
            self.nproc != 1
            or self.rank_timeout != DEFAULT_RANK_TIMEOUT
            or not self.nproc_baseline
            or self.placement != "tensor"
        ):
            from .distributed import validate_distributed

            validate_distributed(self)
        if self.diffusion_steps is not None and self.diffusion_steps < 1:
            raise BadInputError(f"--diffusion-steps must be >= 1 (got {self.diffusion_steps})")
        if self.image is not None:
            self._validate_image()
        if self.block_length is not None and (
            self.block_length < 1 or self.gen % self.block_length
        ):
            raise BadInputError(
                f"--block-length must divide --gen ({self.gen}); got {self.block_length}"
            )

    def _validate_image(self) -> None:
        from .vision import check_image_file

        if self.regime != "prefill":
            raise BadInputError(
                f"--image runs in the prefill regime only (the {self.regime} regime benches a "
                "vision-language model's language model on text prompts): pass --regime "
                "prefill or drop --image"
            )
        if self.nproc != 1 or self.placement != "tensor":
            raise BadInputError(
                "--image runs in one process: drop --nproc / --placement or drop --image"
            )
        check_image_file(self.image or "")

    def _validate_batches(self) -> None:
        batches = tuple(self.batches)
        bad = [b for b in batches if not isinstance(b, int) or isinstance(b, bool) or b < 1]
        if bad:
            raise BadInputError(
                f"--batch entries must be integers >= 1 (got {bad[0]!r}): e.g. --batch 1,8,32"
            )
        if len(set(batches)) != len(batches):
            raise BadInputError(
                f"batch listed twice in --batch {','.join(map(str, batches))}: list each once"
            )
        if batches and self.batch != batches[0]:
            raise BadInputError(
                f"batch {self.batch} is not the first of batches {','.join(map(str, batches))}: "
                "set batch to batches[0] (or use run_sweep(config, batches))"
            )

    @property
    def sweep(self) -> tuple[int, ...]:
        """The batches this config measures, in order (one entry without a sweep)."""
        return tuple(self.batches) or (self.batch,)

    def to_dict(self) -> dict[str, Any]:
        """Every setting that changes what is measured, JSON-able; callers fingerprint it.

        Where the report goes (``report_file``) and how the run was invoked
        (``command_line``) do not change the measurement and are left out.
        """
        return {
            "model_path": str(self.model_path) if self.model_path else None,
            "device": str(self.device),
            "regime": self.regime,
            "seq": self.seq,
            "gen": self.gen,
            "batch": self.batch,
            # Only for a sweep: a single batch's description (e2e's fingerprint) is unchanged.
            **({"batches": list(self.batches)} if len(self.batches) > 1 else {}),
            "arms": list(self.arms),
            "warmup": self.warmup,
            "iters": self.iters,
            "dtype": self.dtype,
            "graph_backend": self.graph_backend,
            "compile_mode": self.compile_mode,
            "seed": self.seed,
            "attn_implementation": self.attn_implementation,
            "trust_remote_code": self.trust_remote_code,
            "ignore_eos": self.ignore_eos,
            "diffusion_steps": self.effective_diffusion_steps,
            "block_length": self.block_length,
            "measure_bandwidth": self.measure_bandwidth,
            "moe_routing": self.moe_routing,
            # Only for a multi-rank run: a single process's description is unchanged.
            **({"nproc": self.nproc} if self.nproc != 1 else {}),
            **({"nproc_baseline": False} if not self.nproc_baseline else {}),
            **({"placement": self.placement} if self.placement != "tensor" else {}),
            # Only with --image: a text run's description (e2e's fingerprint) is unchanged.
            **({"image": str(self.image)} if self.image is not None else {}),
        }

    def load_options(self) -> dict[str, Any]:
        """``loading.load_model``'s options of this run (every arm and rank loads alike)."""
        return {
            "dtype": self.dtype,
            "trust_remote_code": self.trust_remote_code,
            "attn_implementation": self.attn_implementation,
        }

    @property
    def effective_diffusion_steps(self) -> int | None:
        if self.regime != "diffusion-generate":
            return None
        return self.diffusion_steps or self.gen


def make_prompt_ids(tokenizer: Any, batch: int, seq: int, special_ids: set[int]) -> Any:
    """[batch, seq] token ids without special tokens; rows start at different offsets."""
    import torch

    ids = [
        t
        for t in tokenizer(_PROMPT_TEXT, add_special_tokens=False)["input_ids"]
        if t not in special_ids
    ]
    if not ids:
        raise BadInputError("the tokenizer produced no ordinary tokens for the prompt text")
    need = seq + 7 * batch
    while len(ids) < need:
        ids = ids + ids
    rows = [ids[7 * b : 7 * b + seq] for b in range(batch)]
    return torch.tensor(rows, dtype=torch.long)


class _FirstLogitsStamp:
    """Logits processor that records when the prefill's logits exist (synchronized)."""

    def __init__(self, device: Any, synchronize: Callable[[Any], None]) -> None:
        self.device = device
        self.synchronize = synchronize
        self.stamp: float | None = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.stamp is None:
            self.synchronize(self.device)
            self.stamp = time.perf_counter()
        return scores


@dataclass
class _Ctx:
    """What every arm runner needs (one place, so arms cannot drift apart)."""

    config: BenchConfig
    model: Any
    tokenizer: Any
    device: Any
    input_ids: Any
    attention_mask: Any
    eos_ids: list[int]
    pad_id: int | None
    progress: ProgressFn | None
    #: Token ids the prompt avoids (a sweep builds each batch's prompt with them).
    special_ids: set[int] = field(default_factory=set)
    #: Bandwidth and matmul peak, measured once per invocation and shared by a sweep's
    #: per-batch contexts (``dataclasses.replace`` keeps this same dict).
    ceilings: dict[str, Any] = field(default_factory=dict)
    #: A ``pypto_capture.GraphBackend`` object used instead of ``config.graph_backend``
    #: (--nproc ranks: inductor's freezing cannot fold a process group into a constant).
    graph_backend: Any = None
    #: Forward keywords beyond ids and mask: an image prompt's ``pixel_values``,
    #: ``image_grid_thw``, ``mm_token_type_ids`` ... (--image). Empty for text prompts.
    model_inputs: dict[str, Any] = field(default_factory=dict)
    #: --image: batch -> that batch's image-prompt inputs (a sweep rebuilds them per batch).
    image_prompt: Callable[[int], dict[str, Any]] | None = None


class _Memory:
    """Peak memory per arm and reserved-memory growth across measured iterations.

    Accelerators: the allocator's peaks, reset here. CPU has no allocator counters (torch
    reports 0, which reads as a measurement), so there ``peak_allocated`` /
    ``peak_reserved`` are None and the arm's figure is the process's resident-set peak
    (``rss_peak_bytes``, ``measure.RssPeak``), recorded on every device (host memory).
    """

    def __init__(self, device: Any) -> None:
        from pypto_capture import memory_stats, reset_peak_memory

        self.device = device
        self._stats = memory_stats
        self._host = getattr(device, "type", str(device)) == "cpu"
        reset_peak_memory(device)
        self._rss = RssPeak()
        self.reserved: list[int] = []

    def sample(self) -> None:
        self.reserved.append(int(self._stats(self.device).reserved))

    def result(self) -> dict[str, Any]:
        stats = self._stats(self.device)
        growth = (self.reserved[-1] - self.reserved[0]) if len(self.reserved) > 1 else 0
        return {
            "peak_allocated": None if self._host else int(stats.peak_allocated),
            "peak_reserved": None if self._host else int(stats.peak_reserved),
            "reserved_per_iter": list(self.reserved),
            "reserved_growth": int(growth),
            **self._rss.result(),
        }


def _timed(device: Any, fn: Callable[[], Any]) -> tuple[Any, float]:
    from pypto_capture import synchronize

    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


def _tick(ctx: _Ctx, arm: str, done: int) -> None:
    if ctx.progress is not None:
        ctx.progress(arm, done, ctx.config.warmup + ctx.config.iters)


# --- decode ---------------------------------------------------------------------------


def _eager_generate(ctx: _Ctx, extra: dict[str, Any] | None = None) -> tuple[Any, float, float]:
    """One greedy generate: (new tokens [B, n], ttft_s, decode_s).

    ``extra`` adds generate keywords: the hf-compile arm's static cache and CompileConfig,
    so that arm is timed by exactly this code.
    """
    import torch
    from transformers import LogitsProcessorList

    from pypto_capture import synchronize

    cfg = ctx.config
    stamp = _FirstLogitsStamp(ctx.device, synchronize)
    kwargs: dict[str, Any] = {
        "input_ids": ctx.input_ids,
        "attention_mask": ctx.attention_mask,
        "do_sample": False,
        "max_new_tokens": cfg.gen,
        "logits_processor": LogitsProcessorList([stamp]),
        "pad_token_id": ctx.pad_id,
    }
    if cfg.ignore_eos:
        kwargs["min_new_tokens"] = cfg.gen
    kwargs.update(extra or {})
    with torch.inference_mode():
        synchronize(ctx.device)
        start = time.perf_counter()
        out = ctx.model.generate(**kwargs)
        synchronize(ctx.device)
        end = time.perf_counter()
    assert stamp.stamp is not None
    return out[:, ctx.input_ids.shape[1] :], stamp.stamp - start, end - stamp.stamp


def _decode_sample(ctx: _Ctx, tokens: Any, ttft: float, decode_s: float) -> dict[str, Any]:
    counts = count_tokens(tokens, ctx.eos_ids, ignore_eos=ctx.config.ignore_eos)
    decode_tokens = sum(max(0, c - 1) for c in counts)
    return {
        "counts": counts,
        "decode_tokens": decode_tokens,
        "ttft_s": ttft,
        "decode_s": decode_s,
        "tok_s": decode_tokens / decode_s if decode_s > 0 and decode_tokens else 0.0,
    }


def _run_eager_decode(
    ctx: _Ctx, arm: ArmResult, mem: _Memory, extra: dict[str, Any] | None = None
) -> Any:
    cfg = ctx.config
    for i in range(cfg.warmup):
        _eager_generate(ctx, extra)
        _tick(ctx, arm.name, i + 1)
    samples = []
    tokens = None
    for i in range(cfg.iters):
        tokens, ttft, dec = _eager_generate(ctx, extra)
        samples.append(_decode_sample(ctx, tokens, ttft, dec))
        mem.sample()
        _tick(ctx, arm.name, cfg.warmup + i + 1)
    _fill_decode(arm, samples)
    return tokens


def _graph_decode_iteration(ctx: _Ctx, arm: ArmResult) -> Callable[[], tuple[Any, float, float]]:
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
    arm.details["mitigations"] = _mitigation_details(
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
        first, ttft = _timed(ctx.device, lambda: runner.prefill(ctx.input_ids, ctx.attention_mask))
        rest, dec = _timed(ctx.device, lambda: runner.decode(first, cfg.gen - 1))
        return torch.cat([first.reshape(-1, 1), rest], dim=1), ttft, dec

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
        reason = getattr(getattr(runner, "backend", None), "fallback_reason", None)
        if reason:
            arm.warnings.append(f"{arm.name}: {reason}")
        describe = getattr(getattr(runner, "cache", None), "describe", None)
        if callable(describe):
            # The layer-type pattern and per-layer slots (sliding layers hold `window`,
            # full layers max_cache_len): on CPU the allocator peak is 0, so this is the
            # cache's memory figure, and its bytes are what each graph step reads.
            arm.details["kv_cache"] = describe()
        runner.reset()
    return once


def _run_graph_decode(
    ctx: _Ctx, arm: ArmResult, mem: _Memory, keep: dict[str, Any] | None = None
) -> Any:
    """``keep`` receives the iteration function (``keep["once"]``): ``--nproc`` ranks run
    one more, untimed, under the profiler to measure the time in collectives."""
    import torch

    cfg = ctx.config
    once = _graph_decode_iteration(ctx, arm)
    if keep is not None:
        keep["once"] = once
    with torch.inference_mode():
        for i in range(cfg.warmup):
            once()
            _tick(ctx, arm.name, i + 1)
        samples = []
        tokens = None
        for i in range(cfg.iters):
            tokens, ttft, dec = once()
            samples.append(_decode_sample(ctx, tokens, ttft, dec))
            mem.sample()
            _tick(ctx, arm.name, cfg.warmup + i + 1)
    _fill_decode(arm, samples)
    return tokens


def _fill_decode(arm: ArmResult, samples: list[dict[str, Any]]) -> None:
    arm.tokens_per_s = summarize([s["tok_s"] for s in samples])
    arm.seconds = summarize_seconds([s["decode_s"] for s in samples])
    arm.ttft_s = summarize_seconds([s["ttft_s"] for s in samples])
    arm.tokens_per_iter = [s["decode_tokens"] for s in samples]
    arm.details["tokens_per_row"] = samples[-1]["counts"]
    arm.details["generated_tokens_per_iter"] = [sum(s["counts"]) for s in samples]


def _peer_config(ctx: _Ctx, arm: ArmResult) -> Any:
    from .peer import compile_config

    config, described = compile_config(ctx.device, ctx.config.compile_mode)
    arm.details["backend"] = f"transformers CompileConfig ({described.get('backend')})"
    arm.details["peer"] = described
    return config


def _run_peer_decode(ctx: _Ctx, arm: ArmResult, mem: _Memory) -> Any:
    """transformers' static cache + compiled forward through ``generate``, timed as eager.

    The first call compiles (untimed, ``compile_s``); warmup and iterations then follow the
    eager arm's loop with the recipe's generate keywords.
    """
    from .peer import forget_compiled_call, generate_kwargs, used_compiled_call

    extra = generate_kwargs(_peer_config(ctx, arm))
    try:
        _, arm.details["capture_s"] = _timed(ctx.device, lambda: _eager_generate(ctx, extra))
        arm.details["compiled"] = used_compiled_call(ctx.model)
        if not arm.details["compiled"]:
            msg = f"{arm.name}: generate did not take its compiled path (ran uncompiled)"
            log.warning(msg)
            arm.warnings.append(msg)
        return _run_eager_decode(ctx, arm, mem, extra)
    finally:
        forget_compiled_call(ctx.model)


def _peer_prefill_fn(ctx: _Ctx, arm: ArmResult) -> Callable[[], Any]:
    from .peer import compiled_prefill

    call = compiled_prefill(ctx.model, _peer_config(ctx, arm))
    ids, mask, extra = ctx.input_ids, ctx.attention_mask, ctx.model_inputs

    def fn() -> Any:
        return call(input_ids=ids, attention_mask=mask, use_cache=False, **extra).logits

    return fn


def _run_peer_prefill(ctx: _Ctx, arm: ArmResult, mem: _Memory) -> Any:
    import torch

    from .peer import forget_compiled_call

    try:
        fn = _peer_prefill_fn(ctx, arm)
        with torch.inference_mode():
            _, arm.details["capture_s"] = _timed(ctx.device, fn)
        return _run_eager_prefill(ctx, arm, mem, fn)
    finally:
        forget_compiled_call(ctx.model)


# --- prefill --------------------------------------------------------------------------


def _prefill_fn(ctx: _Ctx) -> Callable[[], Any]:
    """One forward over the prompt; with --image the whole VL model on the image prompt."""
    model, ids, mask, extra = ctx.model, ctx.input_ids, ctx.attention_mask, ctx.model_inputs

    def fn() -> Any:
        return model(input_ids=ids, attention_mask=mask, use_cache=False, **extra).logits

    return fn


def _run_eager_prefill(
    ctx: _Ctx, arm: ArmResult, mem: _Memory, fn: Callable[[], Any] | None = None
) -> Any:
    import torch

    cfg = ctx.config
    fn = fn or _prefill_fn(ctx)
    times = []
    out: Any = None
    with torch.inference_mode():
        for i in range(cfg.warmup):
            fn()
            _tick(ctx, arm.name, i + 1)
        for i in range(cfg.iters):
            out, seconds = _timed(ctx.device, fn)
            times.append(seconds)
            mem.sample()
            _tick(ctx, arm.name, cfg.warmup + i + 1)
    _fill_prefill(ctx, arm, times)
    return out.argmax(-1)


def _mitigation_details(handle: Any, backend: str, device_type: str) -> dict[str, Any]:
    """What a graph arm's capture mitigations did (``details.mitigations``), and why."""
    if handle is None:
        return {
            "applied": [],
            "why": f"none: a {backend} capture on {device_type} needs none (NPU graphs do)",
        }
    return {
        "applied": list(handle.applied),
        "skipped": list(handle.skipped),
        "why": f"a {backend} capture on {device_type}: NPU graph capture needs eager attention "
        "(SDPA's side stream: ACL 107025), prebuilt masks and rotary tables",
    }


@contextlib.contextmanager
def _prefill_mitigations(
    ctx: _Ctx, arm: ArmResult, backend: str, *, mitigate: bool | None = None
) -> Any:
    """The capture mitigations the decode runner applies, for a captured prefill.

    The same rule decides (``pypto_capture.needs_capture_mitigations``: NPU graphs) and the
    same patches apply (eager attention, rotary tables, mask functions); a prefill has no
    capture-safe cache to build its masks, so one eager forward of the arm's inputs records
    them and the capture replays them prebuilt. ``mitigate`` overrides the rule (tests run
    the NPU path's patches on the CPU). Undone when the block ends.
    """
    import torch

    from pypto_capture import apply_capture_mitigations, needs_capture_mitigations

    device_type = getattr(ctx.device, "type", str(ctx.device))
    wanted = needs_capture_mitigations(backend, device_type) if mitigate is None else mitigate
    if not wanted:
        arm.details["mitigations"] = _mitigation_details(None, backend, device_type)
        yield None
        return
    handle = apply_capture_mitigations(
        ctx.model, attn="switch", max_positions=int(ctx.input_ids.shape[1])
    )
    try:
        with torch.inference_mode(), handle.recording_masks():
            _prefill_fn(ctx)()
        arm.details["mitigations"] = _mitigation_details(handle, backend, device_type)
        yield handle
    finally:
        handle.undo()


def _run_graph_prefill(
    ctx: _Ctx, arm: ArmResult, mem: _Memory, *, mitigate: bool | None = None
) -> Any:
    import torch

    from pypto_capture import capture_and_replay, make_backend

    cfg = ctx.config
    backend = make_backend(cfg.graph_backend, ctx.device)
    with (
        _prefill_mitigations(ctx, arm, backend.name, mitigate=mitigate),
        torch.inference_mode(),
    ):
        result = capture_and_replay(
            _prefill_fn(ctx),
            warmup=cfg.warmup,
            replays=cfg.iters,
            backend=backend,
            device=ctx.device,
        )
    _tick(ctx, arm.name, cfg.warmup + cfg.iters)
    mem.sample()
    times = list(result.times_s)
    arm.details["backend"] = getattr(result, "backend", cfg.graph_backend)
    arm.details["capture_s"] = getattr(result, "capture_s", None)
    _fill_prefill(ctx, arm, times)
    return result.output.argmax(-1)


def _fill_prefill(ctx: _Ctx, arm: ArmResult, times: list[float]) -> None:
    # Prompt tokens per forward: batch x seq for text; an image prompt is longer (its
    # template and image placeholders come on top of the --seq text tokens).
    n = int(ctx.input_ids.numel())
    arm.tokens_per_s = summarize([n / t for t in times])
    arm.seconds = summarize_seconds(times)
    arm.tokens_per_iter = [n] * len(times)


# --- diffusion ------------------------------------------------------------------------


def _diffusion_call(ctx: _Ctx, plan: dict[str, Any]) -> Any:
    """One generation; ``plan`` holds the arm's keywords (``forward``, ``step_backend``,
    ``native_step``), empty for the eager arm.

    The torch RNG is seeded with ``--seed`` first: a native block-diffusion model samples
    (random canvases, multinomial draws), and every arm and iteration starting from the
    same state is what makes its tokens comparable with the eager arm's.
    """
    import torch

    from .diffusion import diffusion_generate

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


def _diffusion_plan(ctx: _Ctx, arm: ArmResult) -> dict[str, Any]:
    """How the arm drives the model (``details.diffusion.path`` reports which path ran).

    eager: the model's own generation, uncaptured. graph: a protocol model that captures its
    own step gets a pypto-capture backend (``step_backend``); another protocol model gets a
    captured whole-sequence forward (``forward``); a transformers block-diffusion class runs
    its own static-cache ``generate`` with one denoising step captured by the backend
    (``native_step``, :class:`pypto_bench.diffusion.CapturedDenoiserStep`).
    """
    from .diffusion import CapturedDenoiserStep, captures_own_step, native_block_diffusion

    if arm.name == "eager":
        return {}
    if native_block_diffusion(ctx.model) and not captures_own_step(ctx.model):
        from pypto_capture import make_backend

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
    return {"forward": _graph_forward(ctx)}


#: Added to a graph arm that failed on an --image prompt: what was captured and the way on.
IMAGE_CAPTURE_NOTE = (
    "with --image the whole vision-language forward is captured as one graph, vision tower "
    "included; a vision tower that reads the image grid on the host (data-dependent shapes, "
    "e.g. Qwen's) cannot be one graph: bench the language model's graph arm without --image"
)


def _diffusion_sample(ctx: _Ctx, out: Any, seconds: float) -> dict[str, Any]:
    """Per-iteration figures: tokens over generated positions up to EOS, NFE, forwards."""
    from .diffusion import count_generated

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


def _run_diffusion(ctx: _Ctx, arm: ArmResult, mem: _Memory) -> Any:
    import torch

    from .diffusion import native_block_diffusion

    cfg = ctx.config
    plan = _diffusion_plan(ctx, arm)
    calls = {"n": 0}
    if "forward" in plan:
        inner = plan["forward"]
        arm.details["backend"] = getattr(inner, "backend_name", None)

        def counted(ids: Any) -> Any:
            calls["n"] += 1
            return inner(ids)

        plan["forward"] = counted

    samples: list[dict[str, Any]] = []
    out: Any = None
    with torch.inference_mode():
        if plan:  # compile/capture outside timing, like the decode runner
            _, arm.details["capture_s"] = _timed(ctx.device, lambda: _diffusion_call(ctx, plan))
        for i in range(cfg.warmup):
            _diffusion_call(ctx, plan)
            _tick(ctx, arm.name, i + 1)
        for i in range(cfg.iters):
            out, seconds = _timed(ctx.device, lambda: _diffusion_call(ctx, plan))
            samples.append(_diffusion_sample(ctx, out, seconds))
            mem.sample()
            _tick(ctx, arm.name, cfg.warmup + i + 1)
    seqs = out.sequences
    native = native_block_diffusion(ctx.model) and "step_backend" not in plan
    rows, width = tuple(seqs.shape)
    expected = cfg.seq + cfg.gen
    if rows != cfg.batch or (width != expected if not native else width < expected):
        raise RuntimeError(
            f"diffusion generation returned sequences of shape {tuple(seqs.shape)}, expected "
            f"({cfg.batch}, {expected}{' or more' if native else ''})"
        )
    arm.tokens_per_s = summarize([s["tok_s"] for s in samples])
    arm.seconds = summarize_seconds([s["seconds"] for s in samples])
    arm.tokens_per_iter = [s["tokens"] for s in samples]
    arm.details["num_denoising_steps"] = out.num_denoising_steps
    arm.details["diffusion"] = {
        "path": out.path or _default_path(plan, calls),
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
        arm.details["forward_used"] = calls["n"] > 0
    if "native_step" in plan:
        # What the capture cost bought: one step, replayed for every step of every canvas.
        arm.details["diffusion"]["capture"] = plan["native_step"].describe()
    if native:
        # Sampled, not greedy: the token match is between draws from the same seed.
        arm.details["diffusion"]["token_match_basis"] = (
            f"sampled tokens, torch RNG seeded with {cfg.seed} before every generation"
        )
    return seqs[:, cfg.seq :]


def _default_path(plan: dict[str, Any], calls: dict[str, int]) -> str:
    """The path of a protocol model that does not name its own."""
    if "forward" in plan:
        used = "used" if calls["n"] else "ignored by the model"
        return f"diffusion_generate with a captured whole-sequence forward ({used})"
    return "diffusion_generate (the model's own loop)"


def _graph_forward(ctx: _Ctx) -> Callable[[Any], Any]:
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


# --- arms -----------------------------------------------------------------------------


@contextlib.contextmanager
def _kernels_for(ctx: _Ctx, arm_name: str) -> Any:
    """The arm's kernel plug-ins switched on (none but for pypto+graph), as a list."""
    if arm_name != "pypto+graph":
        yield []
        return
    from .plugins import applicable_plugins

    plugins = applicable_plugins(ctx.model)
    with contextlib.ExitStack() as stack:
        for plugin in plugins:
            stack.enter_context(plugin.enable(ctx.model))
        yield plugins


@contextlib.contextmanager
def _moe_routing_for(ctx: _Ctx, arm: ArmResult) -> Any:
    """The graph arms' MoE experts: exact by default, the static proxy on request.

    The eager arm is the reference and keeps the model's own forward, as does the hf-compile
    arm (the user's alternative runs the model as transformers ships it). A dense model
    comes back with an empty handle and the arm is unchanged.
    """
    if arm.name in ("eager", PEER_ARM):
        yield None
        return
    from pypto_capture import apply_moe_routing

    cfg = ctx.config
    # The token counts a capture sees, so the static proxy's tables exist before it.
    counts: tuple[int, ...] = {
        "decode": (cfg.batch,),
        "prefill": (cfg.batch * cfg.seq,),
        # Full-prefix recompute sees the whole sequence; a block-cached step (LLaDA2's
        # captured step) sees one block per row (32 when --block-length is unset).
        "diffusion-generate": (
            cfg.batch * (cfg.seq + cfg.gen),
            cfg.batch * (cfg.block_length or 32),
        ),
    }[cfg.regime]
    handle = apply_moe_routing(ctx.model, cfg.moe_routing, token_counts=counts)
    try:
        if handle.applied:
            arm.details["moe_routing"] = cfg.moe_routing
            arm.details["moe_layers"] = len(handle.modules)
            if cfg.moe_routing == "static":
                arm.outputs_differ_by_design = STATIC_MOE_NOTE
        yield handle
    finally:
        handle.undo()


def _run_arm(ctx: _Ctx, arm: ArmResult) -> Any:
    regime = ctx.config.regime
    mem = _Memory(ctx.device)
    try:
        with _moe_routing_for(ctx, arm), _kernels_for(ctx, arm.name) as plugins:
            if plugins:
                arm.details["plugins"] = [p.name for p in plugins]
            if regime == "decode":
                runner = {"eager": _run_eager_decode, PEER_ARM: _run_peer_decode}.get(
                    arm.name, _run_graph_decode
                )
                tokens = runner(ctx, arm, mem)
            elif regime == "prefill":
                runner = {"eager": _run_eager_prefill, PEER_ARM: _run_peer_prefill}.get(
                    arm.name, _run_graph_prefill
                )
                tokens = runner(ctx, arm, mem)
            else:
                tokens = _run_diffusion(ctx, arm, mem)
            if plugins:
                arm.details["plugin_reports"] = {p.name: p.report() for p in plugins}
    finally:
        arm.memory = mem.result()
    if arm.memory["reserved_growth"] > 0:
        msg = (
            f"{arm.name}: reserved memory grew by {arm.memory['reserved_growth']} bytes across "
            "iterations (dynamic-shape workspace growth?)"
        )
        log.warning(msg)
        arm.warnings.append(msg)
    return tokens


def _record_failure(ctx: _Ctx, arm: ArmResult, err: BaseException) -> None:
    import pypto_capture
    from pypto_capture import CaptureFailedError, explain_capture_error

    arm.ok = False
    try:
        # A capture failure carries its explanation; anything else is explained here.
        expl = err.explanation if isinstance(err, CaptureFailedError) else None
        expl = expl or explain_capture_error(err)
        # Its message and underlying error quote exception text too: redacted like the error.
        arm.explanation = {
            k: redact(v) if isinstance(v, str) else v for k, v in expl.to_dict().items()
        }
    except Exception as inner:  # explaining must never mask the original failure
        arm.explanation = {"code": None, "matched": False, "cause": f"explain failed: {inner}"}
    underlying = underlying_error(arm.explanation)
    # The error line leads with the exception under the wrappers (dynamo's Unsupported
    # around the model's KeyError), so the one line a reader sees names the real error.
    text = " ".join(str(err).split())
    head = type(err).__name__
    if underlying and not f"{head}: {text}".startswith(underlying):
        head = f"{head} [{underlying[:200]}]"
    # Exception text can quote a URL with credentials or an env token: redact at source.
    arm.error = redact(f"{head}: {text[:500]}")
    log.error("arm %s failed: %s", arm.name, arm.error)
    if isinstance(err, CaptureFailedError):
        bisect_capture = getattr(pypto_capture, "bisect_capture", None)
        if bisect_capture is None:
            arm.bisect = {
                "failed_stage": None,
                "error": "this pypto-capture has no bisect_capture()",
            }
            return
        try:
            # Bisect what failed: the fused arm's kernels stay switched on for it.
            with _kernels_for(ctx, arm.name):
                arm.bisect = bisect_capture(
                    ctx.model, backend=ctx.config.graph_backend, device=ctx.device
                ).to_dict()
        except Exception as inner:
            arm.bisect = {
                "failed_stage": None,
                "error": f"bisect failed: {type(inner).__name__}: {inner}",
            }


def run_bench(config: BenchConfig, *, progress: ProgressFn | None = None) -> Report:
    """Run every requested arm; a failing arm is recorded, never fatal to the others.

    Raises only for bad input (``BadInputError``), a missing device
    (``EnvironmentMissingError``), a model that does not load (``ModelLoadError``) or,
    with ``report_file``, a report that could be written nowhere (``ReportWriteError``,
    carrying the JSON). Where the report went is ``report.written_to`` (a fallback path
    when ``report_file`` failed at the end of the run; see ``write_report``).
    """
    config.validate()
    from .loading import check_regime_fits_folder

    # A regime the folder's model cannot run is refused before any rank or weight loads.
    check_regime_fits_folder(config.model_path, config.regime)
    if config.placement == "pipeline":
        from .pipeline import run_pipeline

        return run_pipeline(config)
    if config.nproc > 1:
        from .distributed import run_distributed

        return run_distributed(config, progress=progress)
    if config.report_file:
        from .loading import check_model_folder

        check_model_folder(config.model_path)  # a bad folder is named before a bad report path
        check_report_path(config.report_file)
    ctx, model_info, warnings = _load_context(config, progress)
    from pypto_capture import device_name

    report = new_report(config, device=ctx.device, device_name=device_name(ctx.device))
    report.warnings.extend(warnings)
    report.model = model_info

    load = LoadSampler()
    _measure(ctx, report)
    # The sweep's other batches: same model, same protocol, each its own prompt and arms.
    runs = [(config.batch, report)]
    for batch in config.sweep[1:]:
        sub_ctx = _ctx_for_batch(ctx, batch)
        sub = replace(report, config=sub_ctx.config.to_dict(), arms=[], warnings=[])
        sub.roofline = None
        _measure(sub_ctx, sub)
        runs.append((batch, sub))
    _guard_noise(report, runs, load.stop())
    if len(runs) > 1:
        report.batch_sweep = [_sweep_entry(b, r) for b, r in runs]
        report.ok = all(r.ok for _, r in runs)
    if config.report_file:
        report.write(config.report_file)
    return report


def run_sweep(
    config: BenchConfig, batches: Sequence[int], *, progress: ProgressFn | None = None
) -> Report:
    """``run_bench`` over several batch sizes in one run (the model loaded once).

    The report's arms are the first batch's (the shape of a single-batch report);
    ``report.batch_sweep`` has one entry per batch: tok/s per arm and the decode roofline
    against both ceilings (bandwidth and matmul peak, measured once), naming which binds.
    """
    batches = tuple(batches)
    if not batches:
        raise BadInputError("no batch sizes given: pass e.g. --batch 1,8,32")
    return run_bench(replace(config, batch=batches[0], batches=batches), progress=progress)


def _measure(ctx: _Ctx, report: Report) -> None:
    """Every requested arm at ``ctx``'s batch into ``report``: agreement, roofline, ratios."""
    tokens: dict[str, Any] = {}
    for name in ctx.config.arms:
        arm = ArmResult(name=name)
        report.arms.append(arm)
        try:
            tokens[name] = _run_arm(ctx, arm)
        except Exception as err:
            _record_failure(ctx, arm, err)
            if ctx.model_inputs and name in ("graph", "pypto+graph"):
                arm.warnings.append(f"{name}: {IMAGE_CAPTURE_NOTE}")
    _check_agreement(ctx, report, tokens)
    if ctx.config.regime == "decode":
        _fill_roofline(ctx, report)
    report.finish()


def _ctx_for_batch(ctx: _Ctx, batch: int) -> _Ctx:
    import torch

    config = replace(ctx.config, batch=batch, batches=(), report_file=None)
    if ctx.image_prompt is not None:
        return _apply_image_inputs(replace(ctx, config=config), ctx.image_prompt, batch)
    ids = make_prompt_ids(ctx.tokenizer, batch, config.seq, ctx.special_ids).to(ctx.device)
    return replace(ctx, config=config, input_ids=ids, attention_mask=torch.ones_like(ids))


def _guard_noise(report: Report, runs: list[tuple[int, Report]], load: dict[str, Any]) -> None:
    """Assess every batch's arms (pypto_bench.noise); a noisy run is said loudly."""
    checks: list[dict[str, Any]] = []
    for batch, run in runs:
        where = f"batch {batch} / " if len(runs) > 1 else ""
        got = noise.assess(run.arms, load, where=where)
        if any(c["name"] == "load" for c in checks):
            got = [c for c in got if c["name"] != "load"]
        checks += got
    report.noise = noise.noise_section(checks, load)
    line = noise.summary(report.noise)
    if line:
        log.warning("%s", line)
        report.warnings.append(line)


def _sweep_entry(batch: int, run: Report) -> dict[str, Any]:
    """One batch of a sweep: per-arm figures and the roofline against both ceilings."""
    return {
        "batch": batch,
        "ok": run.ok,
        "arms": [
            {
                "name": a.name,
                "ok": a.ok,
                "error": a.error,
                "tokens_per_s": a.tokens_per_s,
                "ttft_s": a.ttft_s,
                "ratio_to_eager": a.ratio_to_eager,
                "ratio_to_peer": a.ratio_to_peer,
                "token_match": a.token_match,
                "outputs_differ_by_design": a.outputs_differ_by_design,
                "memory": a.memory,
                "roofline": a.roofline,
                "unreliable": a.unreliable,
                "warnings": a.warnings,
            }
            for a in run.arms
        ],
        "roofline": run.roofline,
        "warnings": run.warnings,
    }


def _reference_tokens(ctx: _Ctx) -> Any:
    """Eager tokens for the agreement check when the eager arm was not requested."""
    import torch

    if ctx.config.regime == "decode":
        return _eager_generate(ctx)[0]
    if ctx.config.regime == "prefill":
        with torch.inference_mode():
            return _prefill_fn(ctx)().argmax(-1)
    with torch.inference_mode():
        return _diffusion_call(ctx, {}).sequences[:, ctx.config.seq :]


def _check_agreement(ctx: _Ctx, report: Report, tokens: dict[str, Any]) -> None:
    # An arm whose outputs differ by design (the static MoE proxy) gets no verdict: a
    # "mismatch" there would say nothing about capture.
    others = [
        a for a in report.arms if a.name != "eager" and a.ok and not a.outputs_differ_by_design
    ]
    if not others:
        return
    ref = tokens.get("eager")
    if ref is None:
        try:
            ref = _reference_tokens(ctx)
        except Exception as err:
            report.warnings.append(f"no eager reference for the token match: {err}")
            return
    regime = ctx.config.regime

    def produced(t: Any) -> list[int]:
        # Generated tokens are compared up to each row's EOS (diffusion: every position with
        # --ignore-eos); prefill compares every position's argmax.
        if regime == "decode":
            return count_tokens(t, ctx.eos_ids)
        if regime == "diffusion-generate":
            return count_tokens(t, ctx.eos_ids, ignore_eos=ctx.config.ignore_eos)
        return [t.shape[1]] * t.shape[0]

    ref_counts = produced(ref)
    for arm in others:
        cand = tokens[arm.name]
        cand_counts = produced(cand)
        arm.token_match = match_rate(ref, cand, ref_counts, cand_counts)
        rate = arm.token_match["rate"]
        if rate is not None and rate < 1.0:
            basis = (arm.details.get("diffusion") or {}).get("token_match_basis")
            kind = "same-seed sampled" if basis else "greedy"
            msg = f"{arm.name}: {kind} tokens match eager at {rate:.1%} of positions"
            if str(next(ctx.model.parameters()).dtype) == "torch.float32":
                msg += " (expected exact in fp32)"
            arm.warnings.append(msg)


def _fill_roofline(ctx: _Ctx, report: Report) -> None:
    cfg = ctx.config
    try:
        weights = weight_bytes_read_per_step(ctx.model)
        kv = kv_bytes_per_token(ctx.model)
        moe = _moe_bytes(ctx.model, cfg.batch)
        # Recurrent layers hold no keys and a fixed state instead: read off the model's own
        # cache (None for attention-only models, whose formula above stands).
        probe = cache_bytes_probe(ctx.model, cfg.batch, ctx.device)
    except Exception as err:
        report.warnings.append(f"roofline skipped: {err}")
        return
    state = 0
    if probe is not None:
        kv, state = probe["kv_bytes_per_token"], probe["state_bytes"]
    info: dict[str, Any] = {"weight_bytes": weights, "kv_bytes_per_token": kv}
    if state:
        info["state_bytes"] = state
    if moe is not None:
        # A decode step reads the routed experts only, not all of them.
        weights = weights - moe["expert_bytes"] + moe["active_expert_bytes"]
        info["weight_bytes"] = weights
        info["expert_bytes"] = moe["expert_bytes"]
        info["active_expert_bytes"] = moe["active_expert_bytes"]
    # FLOPs per token: 2 x the parameters one token multiplies (for an MoE model its
    # top-k experts, i.e. the batch-1 active bytes) + attention over the context.
    active_bytes = weights
    params_per_token: float | None
    try:
        moe1 = _moe_bytes(ctx.model, 1) if moe is not None else None
        if moe is not None and moe1 is not None:
            active_bytes = weights - moe["active_expert_bytes"] + moe1["active_expert_bytes"]
        params_per_token = active_bytes / next(ctx.model.parameters()).element_size()
    except Exception as err:
        report.warnings.append(f"compute ceiling skipped: {err}")
        params_per_token = None
    info.update(_ceilings(ctx))
    report.roofline = info
    bw = info.get("bandwidth_bytes_per_s")
    if not bw:
        return
    peak = info.get("matmul_flops_per_s")
    for arm in report.arms:
        if not arm.ok or not arm.tokens_per_s.get("best"):
            continue
        # HF's dynamic cache reads the context so far (mean over the run); a static
        # cache attends over all max_cache_len slots every step.
        context = cfg.seq + cfg.gen / 2 if arm.name == "eager" else cfg.seq + cfg.gen
        kv_arm: float = kv
        cache = arm.details.get("kv_cache") or {}
        # The states are the same for every arm; the capture-safe cache counts its own.
        cache_bytes = cache.get("total_bytes", 0) - cache.get("state_bytes", 0)
        if cache_bytes > 0:
            # The capture-safe cache reads every slot it holds each step (sliding layers
            # only their window): per token of context, for the same formula.
            kv_arm = cache_bytes / (cfg.batch * context)
        flops_per_token = None
        if params_per_token:
            try:
                flops = attention_flops_per_token(
                    ctx.model, context, probe["attention_layers"] if probe else None
                )
                flops_per_token = 2.0 * params_per_token + flops
            except Exception as err:
                arm.warnings.append(f"{arm.name}: compute ceiling skipped: {err}")
        arm.roofline = roofline(
            weight_bytes=weights,
            kv_per_token=kv_arm,
            batch=cfg.batch,
            context_tokens=context,
            bandwidth=bw,
            measured_tok_s=arm.tokens_per_s["best"],
            flops_per_token=flops_per_token,
            flops_per_s=peak,
            state_bytes=cache.get("state_bytes", state) if cache else state,
        )


def _ceilings(ctx: _Ctx) -> dict[str, Any]:
    """The measured bandwidth and matmul peak (the model's dtype), once per invocation:
    a sweep's batches are judged against the same ceilings. Empty with --no-bandwidth."""
    if ctx.ceilings or not ctx.config.measure_bandwidth:
        return ctx.ceilings
    measured = measure_bandwidth(ctx.device)
    ctx.ceilings["bandwidth_bytes_per_s"] = measured["bytes_per_s"]
    ctx.ceilings["bandwidth_method"] = measured["method"]
    try:
        peak = measure_matmul_peak(ctx.device, next(ctx.model.parameters()).dtype)
    except Exception as err:  # the bandwidth ceiling still stands
        ctx.ceilings["matmul_error"] = redact(f"{type(err).__name__}: {err}")
    else:
        ctx.ceilings["matmul_flops_per_s"] = peak["flops_per_s"]
        ctx.ceilings["matmul_method"] = peak["method"]
    return ctx.ceilings


def _moe_bytes(model: Any, batch: int) -> dict[str, int] | None:
    """Expert bytes and the routed ones a decode step of ``batch`` reads (None: dense)."""
    from pypto_capture import moe_weight_bytes

    return moe_weight_bytes(model, batch)


def _load_context(
    config: BenchConfig, progress: ProgressFn | None
) -> tuple[_Ctx, dict[str, Any], list[str]]:
    """Check the folder, prepare the device, load the model and build the inputs.

    One implementation for ``run_bench`` and ``open_session``: what a profiler sees is
    the model, device and prompt the bench measured.
    """
    from .environment import prepare_device_env
    from .loading import check_model_folder, check_regime_fits_folder, load_model

    folder = check_model_folder(config.model_path)
    check_regime_fits_folder(folder, config.regime)
    image = None
    if config.image is not None:
        from .loading import auto_class_name, read_model_config
        from .vision import read_image

        # Bad input is named before anything heavy runs: the file, then the model kind.
        image = read_image(config.image)
        auto_class_name(read_model_config(folder), image=True, path=folder)
    warnings = prepare_device_env(config.device)

    import torch

    from pypto_capture import memory_stats, reset_peak_memory

    from .environment import open_device

    device = open_device(config.device)

    from .measure import RssPeak

    torch.manual_seed(config.seed)
    reset_peak_memory(device)
    load_rss = RssPeak()  # CPU: the allocator keeps no peaks, the resident set does
    loaded = load_model(
        config.model_path, device=device, image=image is not None, **config.load_options()
    )
    load_mem = memory_stats(device)
    model, tokenizer = loaded.model, loaded.tokenizer
    if config.regime == "diffusion-generate":
        from .diffusion import supports_diffusion, unsupported_message

        if not supports_diffusion(model):
            raise RegimeNotSupportedError(unsupported_message(model))
    else:
        from .diffusion import native_block_diffusion
        from .loading import TOKEN_BY_TOKEN_REGIMES, block_diffusion_refusal

        # The config did not tell (remote code): the loaded class does.
        if config.regime in TOKEN_BY_TOKEN_REGIMES and native_block_diffusion(model):
            raise RegimeNotSupportedError(
                block_diffusion_refusal(type(model).__name__, config.regime)
            )
    model_info = {
        "path": str(loaded.path),
        "class": type(model).__name__,
        "model_type": loaded.config.get("model_type"),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "parameters": sum(p.numel() for p in model.parameters()),
        "load_s": loaded.load_seconds,
        "load_memory": {
            # None on CPU (no allocator counters there), as for the arms.
            "peak_allocated": int(load_mem.peak_allocated) if device.type != "cpu" else None,
            "peak_reserved": int(load_mem.peak_reserved) if device.type != "cpu" else None,
            **load_rss.result(),
        },
    }
    ctx = make_context(config, model, tokenizer, device, progress)
    if image is not None:
        ctx = _with_image_prompt(ctx, loaded, image)
    if loaded.vision_language:
        from .vision import vl_info

        model_info["vl"] = vl_info(
            model,
            image=image,
            prompter=getattr(ctx.image_prompt, "prompter", None),
            inputs={"input_ids": ctx.input_ids} if image is not None else None,
        )
        log.info(
            "%s is a vision-language model: benching its %s",
            model_info["vl"]["class"],
            model_info["vl"]["benched"],
        )
    return ctx, model_info, warnings


def _with_image_prompt(ctx: _Ctx, loaded: Any, image: Any) -> _Ctx:
    """``ctx`` with the image + text prompt of --image (the folder's processor builds it).

    The text is the --seq tokens the text prompt would hold, decoded; every row holds the
    same image and text, so rows need no padding.
    """
    import inspect

    import torch

    from .vision import load_image_prompter

    prompter = load_image_prompter(
        loaded.path,
        loaded.config,
        loaded.tokenizer,
        trust_remote_code=ctx.config.trust_remote_code,
    )
    accepted = set(inspect.signature(ctx.model.forward).parameters)
    text_ids = make_prompt_ids(ctx.tokenizer, 1, ctx.config.seq, ctx.special_ids)[0].tolist()
    text = ctx.tokenizer.decode(text_ids, skip_special_tokens=True)
    dtype = next(ctx.model.parameters()).dtype

    def build(batch: int) -> dict[str, Any]:
        out = {}
        for key, value in prompter.inputs(image.image, text, batch, accepted).items():
            if isinstance(value, torch.Tensor):
                value = value.to(ctx.device)
                if value.is_floating_point():
                    value = value.to(dtype)
            out[key] = value
        return out

    build.prompter = prompter  # type: ignore[attr-defined]
    return _apply_image_inputs(ctx, build, ctx.config.batch)


def _apply_image_inputs(ctx: _Ctx, build: Callable[[int], dict[str, Any]], batch: int) -> _Ctx:
    inputs = dict(build(batch))
    ids = inputs.pop("input_ids")
    mask = inputs.pop("attention_mask", None)
    if mask is None:
        import torch

        mask = torch.ones_like(ids)
    return replace(ctx, input_ids=ids, attention_mask=mask, model_inputs=inputs, image_prompt=build)


def make_context(
    config: BenchConfig, model: Any, tokenizer: Any, device: Any, progress: ProgressFn | None
) -> _Ctx:
    """The prompt and everything an arm runner needs, for a loaded model.

    One definition for the single-process bench and each rank of ``--nproc``: every run
    builds its prompt from the same rule (same special-token exclusions, same offsets).
    """
    import torch

    from .loading import eos_token_ids

    eos = eos_token_ids(model, tokenizer)
    special = set(eos) | {
        t for t in (tokenizer.pad_token_id, tokenizer.bos_token_id) if t is not None
    }
    special |= set(getattr(tokenizer, "all_special_ids", []) or [])
    input_ids = make_prompt_ids(tokenizer, config.batch, config.seq, special).to(device)
    return _Ctx(
        special_ids=special,
        config=config,
        model=model,
        tokenizer=tokenizer,
        device=device,
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        eos_ids=eos,
        pad_id=tokenizer.pad_token_id,
        progress=progress,
    )


class BenchSession:
    """The model, inputs and per-arm iteration a bench run measures, for other tools.

    pypto-tune profiles "the step pypto-bench measures": it opens a session with the same
    ``BenchConfig`` and runs ``iteration(arm)`` under its profiler, so the profiled step
    and the timed one are the same code (MoE routing and kernel plug-ins included).
    """

    def __init__(self, ctx: _Ctx, model_info: dict[str, Any], warnings: list[str]) -> None:
        self._ctx = ctx
        self.model_info = model_info
        self.warnings = warnings

    @property
    def config(self) -> BenchConfig:
        return self._ctx.config

    @property
    def model(self) -> Any:
        return self._ctx.model

    @property
    def tokenizer(self) -> Any:
        return self._ctx.tokenizer

    @property
    def device(self) -> Any:
        return self._ctx.device

    @property
    def input_ids(self) -> Any:
        return self._ctx.input_ids

    @contextlib.contextmanager
    def iteration(self, arm_name: str) -> Any:
        """Yield a no-argument callable running one measured iteration of ``arm_name``.

        Decode: eager is one ``generate`` (its first forward is the prefill), the graph arms
        a prefill plus ``gen - 1`` captured steps (capture happens before the yield).
        Prefill: one forward (captured for the graph arms). Diffusion: one generation.
        The arm's details (backend, kv_cache, plug-ins) are in ``self.details`` afterwards.
        """
        import torch

        if arm_name not in ARMS:
            raise BadInputError(f"unknown arm {arm_name!r}: choose from {', '.join(ARMS)}")
        ctx = self._ctx
        arm = ArmResult(name=arm_name)
        self.details = arm.details
        with (
            _moe_routing_for(ctx, arm),
            _kernels_for(ctx, arm_name) as plugins,
            contextlib.ExitStack() as stack,
        ):
            if plugins:
                arm.details["plugins"] = [p.name for p in plugins]
            regime = ctx.config.regime
            fn: Callable[[], Any]
            if arm_name == PEER_ARM and regime not in PEER_REGIMES:
                raise BadInputError(
                    f"the {PEER_ARM} arm runs in the {' and '.join(PEER_REGIMES)} regimes only"
                )
            if regime == "decode" and arm_name == "eager":
                fn = lambda: _eager_generate(ctx)  # noqa: E731
            elif regime == "decode" and arm_name == PEER_ARM:
                from .peer import generate_kwargs

                extra = generate_kwargs(_peer_config(ctx, arm))
                fn = lambda: _eager_generate(ctx, extra)  # noqa: E731
            elif regime == "prefill" and arm_name == PEER_ARM:
                fn = _peer_prefill_fn(ctx, arm)
            elif regime == "decode":
                fn = _graph_decode_iteration(ctx, arm)
            elif regime == "prefill" and arm_name == "eager":
                fn = _prefill_fn(ctx)
            elif regime == "prefill":
                from pypto_capture import STEP_MARKER, make_backend

                backend = make_backend(ctx.config.graph_backend, ctx.device)
                arm.details["backend"] = backend.name
                # Kept on while the session replays (closed with the session's arm).
                stack.enter_context(_prefill_mitigations(ctx, arm, backend.name))
                with torch.inference_mode():
                    replay = backend.capture(_prefill_fn(ctx), warmup=1).replay

                def fn() -> Any:
                    # One forward = one step, as the eager arm's forward is (pypto-tune).
                    if torch.autograd._profiler_enabled():
                        with torch.profiler.record_function(STEP_MARKER):
                            return replay()
                    return replay()
            else:
                plan = _diffusion_plan(ctx, arm)
                fn = lambda: _diffusion_call(ctx, plan)  # noqa: E731

            def run() -> Any:
                with torch.inference_mode():
                    return fn()

            try:
                yield run
            finally:
                if arm_name == PEER_ARM:
                    from .peer import forget_compiled_call

                    forget_compiled_call(ctx.model)
            if plugins:
                arm.details["plugin_reports"] = {p.name: p.report() for p in plugins}


def open_session(config: BenchConfig, *, progress: ProgressFn | None = None) -> BenchSession:
    """Validate ``config``, load its model and inputs; raises as ``run_bench`` does."""
    config.validate()
    if config.nproc != 1:
        raise BadInputError(
            f"a session is one process; --nproc {config.nproc} runs through run_bench only: "
            "pass --nproc 1"
        )
    return BenchSession(*_load_context(config, progress))
