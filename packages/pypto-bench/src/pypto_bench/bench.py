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

How each (regime x arm) is measured lives in :mod:`pypto_bench.protocol` (one module
per regime); what a run is asked to do and its rules in :mod:`pypto_bench.config`. This
module runs the arms, the batch sweep, the agreement check and the roofline.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from pypto_common import redact

from . import noise
from .config import (
    ARMS,
    GRAPH_ARMS,
    GRAPH_BACKENDS,
    MOE_ROUTINGS,
    PEER_ARM,
    PEER_REGIMES,
    REGIMES,
    Arm,
    BenchConfig,
    Placement,
    Regime,
    Schedule,
)
from .errors import BadInputError, EnvironmentMissingError, RegimeNotSupportedError
from .measure import (
    attention_flops_per_token,
    cache_bytes_probe,
    kv_bytes_per_token,
    match_rate,
    measure_bandwidth,
    measure_matmul_peak,
    roofline,
    weight_bytes_read_per_step,
)
from .noise import LoadSampler
from .protocol import (
    STATIC_MOE_NOTE,
    Context,
    ProgressFn,
    arm_iteration,
    kernels_for,
    make_context,
    make_prompt_ids,
    measure_arm,
    reference_tokens,
    regime_for,
)
from .report import (
    ArmResult,
    Report,
    check_report_path,
    model_section,
    new_report,
    underlying_error,
)
from .rounds import Fallback, run_interleaved

__all__ = [
    "ARMS",
    "GRAPH_BACKENDS",
    "IMAGE_CAPTURE_NOTE",
    "MOE_ROUTINGS",
    "PEER_ARM",
    "PEER_REGIMES",
    "REGIMES",
    "STATIC_MOE_NOTE",
    "BenchConfig",
    "BenchSession",
    "ProgressFn",
    "make_context",
    "make_prompt_ids",
    "open_session",
    "run_bench",
    "run_sweep",
]

log = logging.getLogger(__name__)

#: Added to a graph arm that failed on an --image prompt: what was captured and the way on.
IMAGE_CAPTURE_NOTE = (
    "with --image the whole vision-language forward is captured as one graph, vision tower "
    "included; a vision tower that reads the image grid on the host (data-dependent shapes, "
    "e.g. Qwen's) cannot be one graph: bench the language model's graph arm without --image"
)


#: Seconds the staged-capture bisect after a failed capture may start stages for (a stage
#: started runs to its end): what runs after a failed arm is bounded too (issue #44).
BISECT_BUDGET_S = 300.0


def _record_failure(ctx: Context, arm: ArmResult, err: BaseException) -> None:
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
    # The explanation clips a long message ("..."): a clipped copy of this very error is
    # not a different underlying one.
    if underlying and not f"{head}: {text}".startswith(underlying.removesuffix("...")):
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
            with kernels_for(ctx, arm.name):
                arm.bisect = bisect_capture(
                    ctx.model,
                    backend=ctx.config.graph_backend,
                    device=ctx.device,
                    budget_s=BISECT_BUDGET_S,
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
    # Multi-device runs (validated above: they do not validate again).
    if config.placement == Placement.PIPELINE:
        from .multi import run_pipeline

        return run_pipeline(config, validated=True)
    if config.nproc > 1 or config.nnodes > 1:
        from .multi import run_distributed

        return run_distributed(config, progress=progress, validated=True)
    if config.report_file:
        from .loading import check_model_folder

        check_model_folder(config.model_path)  # a bad folder is named before a bad report path
        check_report_path(config.report_file)
    if config.reference:
        _check_reference_device(config.reference)
    ctx, model_info, warnings = _load_context(config, progress)
    from pypto_capture import device_name

    report = new_report(config, device=ctx.device, device_name=device_name(ctx.device))
    report.warnings.extend(warnings)
    report.model = model_info

    load = LoadSampler()
    eager_ref = _measure(ctx, report)
    if config.reference:
        _reference_check(ctx, report, eager_ref)
    # The sweep's other batches: same model, same protocol, each its own prompt and arms.
    runs = [(config.batch, report)]
    for batch in config.sweep[1:]:
        sub_ctx = _ctx_for_batch(ctx, batch)
        sub = replace(report, config=sub_ctx.config.to_dict(), arms=[], warnings=[], schedule=None)
        sub.roofline = None
        _measure(sub_ctx, sub)
        runs.append((batch, sub))
    line = noise.guard(report, load.stop(), batches=runs)
    if line:
        log.warning("%s", line)
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


def _check_reference_device(spec: str) -> None:
    """``--reference DEVICE`` names a device that exists here, before anything loads."""
    from pypto_capture import DeviceNotAvailableError, InvalidDeviceSpecError, resolve_device

    try:
        resolve_device(spec)
    except InvalidDeviceSpecError as err:
        raise BadInputError(f"--reference {spec}: {err}") from err
    except DeviceNotAvailableError as err:
        raise EnvironmentMissingError(f"--reference {spec}: {err}") from err


def _reference_check(ctx: Context, report: Report, eager_ref: Any) -> None:
    """``--reference DEVICE``: the eager arm against the reference device (after the arms:
    the reference models load one at a time beside the target)."""
    from .reference import reference_check
    from .report import reference_line

    report.reference_check = reference_check(ctx, eager_ref)
    if report.reference_failed:
        allowed = " (allowed by --allow-inaccurate)" if ctx.config.allow_inaccurate else ""
        report.warnings.append(
            f"eager: {reference_line(report.reference_check)}{allowed}: the target computes "
            "something else than the reference device, in every arm"
        )


def _measure(ctx: Context, report: Report) -> Any:
    """Every requested arm at ``ctx``'s batch into ``report``: agreement, roofline, ratios.

    ``--schedule interleaved`` (default): every arm built, then timed in balanced rounds
    (:mod:`pypto_bench.rounds`); where that is unsafe, or with ``--schedule sequential``,
    one arm after the other. ``report.schedule`` records which, and the order. Returns the
    numerical gate's eager reference (None: no gate ran).
    """

    def failed(arm: ArmResult, err: BaseException) -> None:
        _record_failure(ctx, arm, err)
        if ctx.model_inputs and arm.name in GRAPH_ARMS:
            arm.warnings.append(f"{arm.name}: {IMAGE_CAPTURE_NOTE}")

    tokens: dict[str, Any] = {}
    why = None
    gate = _numerics_gate(ctx, report)
    after = gate.after if gate is not None else None
    try:
        if ctx.config.schedule == Schedule.INTERLEAVED:
            arms = [ArmResult(name=name) for name in ctx.config.arms]
            try:
                tokens, report.schedule = run_interleaved(ctx, arms, failed, after=after)
                report.arms.extend(arms)
            except Fallback as err:
                why = f"not interleaved: {err}"
                log.info("%s: running the arms one after the other", why)
        if report.schedule is None:
            order: list[list[Any]] = []
            for name in ctx.config.arms:
                arm = ArmResult(name=name)
                report.arms.append(arm)
                try:
                    tokens[name] = measure_arm(ctx, arm, **({"after": after} if after else {}))
                    order += [[name, i] for i in range(len(arm.tokens_per_s.get("samples") or []))]
                except Exception as err:
                    failed(arm, err)
            report.schedule = {
                "kind": Schedule.SEQUENTIAL.value,
                "requested": ctx.config.schedule,
                "rounds": ctx.config.iters,
                "order": order,
                **({"why": why} if why else {}),
            }
        _check_agreement(ctx, report, tokens)
        if gate is not None:
            gate.locate(report.arms)
    finally:
        if gate is not None:
            gate.close()  # its dumps, whatever happened
    _numerics_verdict(ctx, report)
    if ctx.config.regime == Regime.DECODE:
        _fill_roofline(ctx, report)
    report.finish()
    return gate.ref if gate is not None else None


def _numerics_gate(ctx: Context, report: Report) -> Any:
    """The numerical gate of this run (pypto_bench.numerics), its eager reference taken
    now on the model as loaded; None when no arm needs it."""
    from .numerics import Gate, eager_reference

    if not any(name != Arm.EAGER for name in ctx.config.arms):
        return None
    try:
        ref = eager_reference(ctx)
    except Exception as err:  # the eager arm will say why it fails; the gate says it too
        report.warnings.append(f"numerics not checked: the eager reference failed: {err}")
        return None
    return Gate(ctx, ref)


def _numerics_verdict(ctx: Context, report: Report) -> None:
    """Arms the gate failed: a report warning each, and the user's --allow-inaccurate;
    arms it did not check say why."""
    for arm in report.arms:
        if arm.numerics is None and arm.ok and arm.name != Arm.EAGER:
            arm.numerics = {
                "verdict": "exempt" if arm.outputs_differ_by_design else "not checked",
                "why": arm.outputs_differ_by_design or "no eager reference (see the warnings)",
            }
        num = arm.numerics or {}
        if num.get("verdict") != "fail":
            continue
        if ctx.config.allow_inaccurate:
            num["allowed_by_user"] = True
        allowed = " (allowed by --allow-inaccurate)" if ctx.config.allow_inaccurate else ""
        report.warnings.append(
            f"{arm.name}: numerics FAIL{allowed}: {num.get('why')}: it computes something "
            "else than eager, its ratios are not comparable"
        )


def _ctx_for_batch(ctx: Context, batch: int) -> Context:
    import torch

    config = replace(ctx.config, batch=batch, batches=(), report_file=None)
    if ctx.image_prompt is not None:
        return _apply_image_inputs(replace(ctx, config=config), ctx.image_prompt, batch)
    ids = make_prompt_ids(ctx.tokenizer, batch, config.seq, ctx.special_ids).to(ctx.device)
    return replace(ctx, config=config, input_ids=ids, attention_mask=torch.ones_like(ids))


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
                # The paired ratios of this batch's rounds, with their 95% intervals.
                "ratio_vs_eager": a.ratio_vs_eager,
                "ratio_vs_peer": a.ratio_vs_peer,
                "token_match": a.token_match,
                "numerics": a.numerics,
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
        # Each batch's arms run in their own rounds (interleaved unless it says why not).
        "schedule": run.schedule,
    }


def _check_agreement(ctx: Context, report: Report, tokens: dict[str, Any]) -> None:
    eager = next((a for a in report.arms if a.name == Arm.EAGER), None)
    if eager is not None and not eager.ok and "NonFiniteLogitsError" in (eager.error or ""):
        # The same model computes NaN in every arm; a captured arm's argmax of NaN would
        # "match" and its ratio be quoted. Non-finite logits fail every arm, always.
        for arm in report.arms:
            if arm.ok and arm.name != Arm.EAGER:
                arm.ok = False
                arm.error = (
                    "NonFiniteLogitsError: not comparable: the eager arm's logits hold NaN or "
                    "+inf, so this arm's tokens are the argmax of no answer"
                )
        return
    # An arm whose outputs differ by design (the static MoE proxy) gets no verdict: a
    # "mismatch" there would say nothing about capture.
    others = [
        a for a in report.arms if a.name != Arm.EAGER and a.ok and not a.outputs_differ_by_design
    ]
    if not others:
        return
    ref = tokens.get(Arm.EAGER)
    if ref is None:
        try:
            ref = reference_tokens(ctx)
        except Exception as err:
            report.warnings.append(f"no eager reference for the token match: {err}")
            return
    produced = regime_for(ctx.config).produced
    ref_counts = produced(ctx, ref)
    for arm in others:
        cand = tokens[arm.name]
        cand_counts = produced(ctx, cand)
        arm.token_match = match_rate(ref, cand, ref_counts, cand_counts)
        rate = arm.token_match["rate"]
        if rate is not None and rate < 1.0:
            basis = (arm.details.get("diffusion") or {}).get("token_match_basis")
            kind = "same-seed sampled" if basis else "greedy"
            msg = f"{arm.name}: {kind} tokens match eager at {rate:.1%} of positions"
            if str(next(ctx.model.parameters()).dtype) == "torch.float32":
                msg += " (expected exact in fp32)"
            arm.warnings.append(msg)


def _fill_roofline(ctx: Context, report: Report) -> None:
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
        context = cfg.seq + cfg.gen / 2 if arm.name == Arm.EAGER else cfg.seq + cfg.gen
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


def _ceilings(ctx: Context) -> dict[str, Any]:
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
) -> tuple[Context, dict[str, Any], list[str]]:
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
    from .loading import pinned_code_ignored

    fallback = pinned_code_ignored(loaded.config, loaded.path, config.trust_remote_code)
    if fallback:
        warnings.append(fallback)
    if config.regime == Regime.DIFFUSION:
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
    model_info = model_section(
        model,
        path=loaded.path,
        model_type=loaded.config.get("model_type"),
        load_s=loaded.load_seconds,
        load_memory={
            # None on CPU (no allocator counters there), as for the arms.
            "peak_allocated": int(load_mem.peak_allocated) if device.type != "cpu" else None,
            "peak_reserved": int(load_mem.peak_reserved) if device.type != "cpu" else None,
            **load_rss.result(),
        },
    )
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


def _with_image_prompt(ctx: Context, loaded: Any, image: Any) -> Context:
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


def _apply_image_inputs(
    ctx: Context, build: Callable[[int], dict[str, Any]], batch: int
) -> Context:
    inputs = dict(build(batch))
    ids = inputs.pop("input_ids")
    mask = inputs.pop("attention_mask", None)
    if mask is None:
        import torch

        mask = torch.ones_like(ids)
    return replace(ctx, input_ids=ids, attention_mask=mask, model_inputs=inputs, image_prompt=build)


class BenchSession:
    """The model, inputs and per-arm iteration a bench run measures, for other tools.

    pypto-tune profiles "the step pypto-bench measures": it opens a session with the same
    ``BenchConfig`` and runs ``iteration(arm)`` under its profiler, so the profiled step
    and the timed one are the same code (MoE routing and kernel plug-ins included).
    """

    def __init__(self, ctx: Context, model_info: dict[str, Any], warnings: list[str]) -> None:
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
        arm = ArmResult(name=arm_name)
        self.details = arm.details
        with arm_iteration(self._ctx, arm) as run:
            yield run


def open_session(config: BenchConfig, *, progress: ProgressFn | None = None) -> BenchSession:
    """Validate ``config``, load its model and inputs; raises as ``run_bench`` does."""
    config.validate()
    if config.nproc != 1:
        raise BadInputError(
            f"a session is one process; --nproc {config.nproc} runs through run_bench only: "
            "pass --nproc 1"
        )
    if config.nnodes != 1:
        raise BadInputError(
            f"a session is one process; --nnodes {config.nnodes} runs through `pypto-bench "
            "run` only: drop --nnodes"
        )
    return BenchSession(*_load_context(config, progress))
