"""The numerical gate: a fast arm that computes something else is not a speedup.

Every non-eager arm of a decode or prefill run is held to the eager arm's logits on the
same inputs, judged by pypto-precision's rule (:func:`pypto_precision.judge_logits`):

* **decode, graph arms** (graph, pypto+graph): the captured step is replayed on the eager
  reference's own tokens (teacher forcing, ``DecodeStepRunner.forced_logits``), so one
  flipped token does not fail every later step and a 1% error in one layer that leaves
  every argmax unchanged still shows in the KL;
* **decode, hf-compile**: transformers' ``generate`` takes no forced tokens, so its logits
  are compared step by step up to and including the first step whose token differs (each
  of those steps was fed the same tokens as the reference): the report says how many;
* **prefill**: every position's logits of the arm's forward against eager's.

The reference is one untimed eager pass on the model as loaded, before any arm runs (its
tokens are the eager arm's). An arm fails when its logits are non-finite or its KL max
exceeds the dtype's allowance; the report carries the numbers it was judged against.
Arms whose outputs differ by design (the static MoE proxy) are exempt and say so. The
diffusion regime's denoiser is judged step by step (pypto_bench.denoiser).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import Arm, Regime
from .protocol import Context
from .report import ArmResult

__all__ = [
    "FLOOR_K",
    "FLOOR_MIN_KL",
    "GATE_KL_MAX",
    "HALF_DTYPES",
    "NUMERICS_BASIS",
    "PASSAGE",
    "PASSAGE_NAME",
    "Gate",
    "Reference",
    "arm_logits",
    "arm_numerics",
    "dump_modules",
    "eager_reference",
    "half_floor",
    "judge_arm",
    "passage_ids",
    "perplexity",
    "precheck",
    "teacher_forced_logits",
]

log = logging.getLogger(__name__)

#: The KL max (nats per step) an arm may show against eager on the same device and dtype.
#: Full precision is tight: eager and a correct captured arm differ by reduction order only
#: (measured on the tiny Llama: 1.4e-15 in fp32), while one layer's MLP 1% off gives 4e-8.
#: The half types take pypto-precision's defaults until the gate measures their floor.
GATE_KL_MAX = {"float64": 1e-12, "float32": 1e-9, "float16": 1e-3, "bfloat16": 1e-2}

#: The text perplexity is measured on (package data, public domain: texts/README.md).
PASSAGE = "gettysburg.txt"
PASSAGE_NAME = "the Gettysburg Address (1863, public domain)"

#: What every verdict is judged against, for the report.
NUMERICS_BASIS = "the eager arm's logits on the same device and dtype, teacher-forced"


@dataclass(frozen=True)
class Reference:
    """The eager pass the arms are judged against."""

    regime: str
    dtype: str
    logits: Any  # decode [B, n, V] (step 0: the prefill's last position); prefill [B, S, V]
    tokens: Any = None  # decode: the eager greedy tokens [B, n]
    #: Half types: eager's own logits in this dtype against a float32 copy of the model on
    #: the same device, teacher-forced on the same tokens (the dtype's noise floor).
    floor: Any = None  # a pypto_precision.LogitMetrics, or None
    #: The float32 copy's teacher-forced logits (the floor's reference), shaped as ``logits``.
    float32_logits: Any = None
    #: Why no floor was measured (None: measured, or a full-precision dtype).
    floor_note: str | None = None
    #: Decode: the eager pass's per-step seconds (device synchronized), for its latency.
    step_seconds: tuple[float, ...] = ()


#: The half types, judged against their measured floor (``FLOOR_K`` x its KL max).
HALF_DTYPES = ("bfloat16", "float16")
#: How many times eager's own error against float32 an arm may show (pypto-precision's
#: default k, as torch's accuracy checker and msprobe's pre-check use per op).
FLOOR_K = 2.0
#: The least KL max allowed with a floor (a floor of ~0 would fail every rounding).
FLOOR_MIN_KL = {"float16": 1e-8, "bfloat16": 1e-7}


def _dtype(ctx: Context) -> str:
    return str(next(ctx.model.parameters()).dtype).replace("torch.", "")


def eager_reference(ctx: Context, *, floor: bool = True) -> Any:
    """The eager reference of this run's regime: a :class:`Reference` (decode, prefill), a
    :class:`~pypto_bench.denoiser.DenoiserReference` (diffusion), None (not checked).
    ``floor=False``: no half-type floor (a float32 copy of the model) is measured."""
    import torch

    regime = ctx.config.regime
    dtype = _dtype(ctx)
    if regime == Regime.DIFFUSION:
        from .denoiser import denoiser_reference

        return denoiser_reference(ctx)
    if regime == Regime.DECODE:
        from .protocol.decode import generate_logits

        times: list[float] = []
        tokens, logits = generate_logits(ctx, step_times=times)
        ref = Reference(regime, dtype, logits, tokens, step_seconds=tuple(times))
    elif regime == Regime.PREFILL:
        from .protocol.prefill import prefill_fn

        with torch.inference_mode():
            logits = prefill_fn(ctx)()
        ref = Reference(regime, dtype, logits)
    else:
        return None
    if dtype not in HALF_DTYPES or not floor:
        return ref
    floor, full, note = half_floor(ctx, ref)
    return Reference(ref.regime, dtype, ref.logits, ref.tokens, floor, full, note, ref.step_seconds)


def teacher_forced_logits(ctx: Context, ref: Reference, model: Any = None) -> Any:
    """The reference's logits recomputed by ``model`` (default: the context's), teacher-
    forced: one forward over the prompt and the eager tokens (decode) or the prompt
    (prefill), shaped as ``ref.logits``. A sharded model's logits come back whole."""
    import torch

    model = ctx.model if model is None else model
    ids, mask = ctx.input_ids, ctx.attention_mask
    param = next(model.parameters(), None)
    if param is not None and param.device != ids.device:  # a reference on another device
        ids, mask = ids.to(param.device), mask.to(param.device)
    n = 0
    if ref.tokens is not None:
        n = int((ref.tokens if ref.logits is None else ref.logits).shape[1])
        fed = ref.tokens[:, : n - 1].to(ids.device)
        ids = torch.cat([ids, fed], dim=1)
        mask = torch.cat([mask, torch.ones_like(fed)], dim=1)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
    if ref.tokens is not None:
        p = int(ctx.input_ids.shape[1])
        logits = logits[:, p - 1 : p - 1 + n]
    return logits


def _teacher_forced_float32(ctx: Context, ref: Reference) -> Any:
    """:func:`teacher_forced_logits` of a float32 copy of the model (the floor's reference)."""
    import copy

    import torch

    model = copy.deepcopy(ctx.model).to(torch.float32)
    try:
        return teacher_forced_logits(ctx, ref, model)
    finally:
        del model


def half_floor(ctx: Context, ref: Reference) -> tuple[Any, Any, str | None]:
    """(eager's own metrics against float32, the float32 logits, None), or (None, None,
    why not measured)."""
    from pypto_capture.device import free_bytes
    from pypto_precision import logit_metrics

    weights = sum(p.numel() for p in ctx.model.parameters()) * 4
    free = free_bytes(ctx.device)
    if free is None or weights * 1.5 > free:
        return (
            None,
            None,
            (
                f"no float32 copy fits beside the model ({weights / 2**30:.1f} GiB needed, "
                f"{'unknown' if free is None else f'{free / 2**30:.1f} GiB'} free): the "
                f"{ref.dtype} default allowance applies"
            ),
        )
    try:
        full = _teacher_forced_float32(ctx, ref)
        return logit_metrics(ref.logits, full), full, None
    except Exception as err:  # the floor is a refinement: say why it is missing
        log.warning("no %s floor: %s", ref.dtype, err)
        note = f"the float32 pass failed ({type(err).__name__}: {err}): default allowance"
        return None, None, note


def _first_difference(tokens: Any, ref: Any) -> int:
    """Index of the first step where any row's token differs (the length if none)."""
    n = min(int(tokens.shape[1]), int(ref.shape[1]))
    differs = (tokens[:, :n].to(ref.device) != ref[:, :n]).any(dim=0)
    hits = differs.nonzero()
    return int(hits[0].item()) if hits.numel() else n


def arm_logits(
    ctx: Context, arm: ArmResult, run: Any, ref: Reference, *, eager: bool = False
) -> tuple[Any, int | None, str]:
    """(arm logits, the reference's steps they cover (None: all), basis) for ``arm``,
    built as it was timed.

    ``eager``: the eager arm is judged too (a sharded run against the 1-rank reference):
    its decode logits are one teacher-forced forward over the reference's tokens. Every
    rank of a sharded run calls this in the same order (the forwards are collective).
    """
    fn = getattr(run, "__wrapped__", run)
    if ref.regime == Regime.PREFILL:
        import torch

        if fn is None:
            return teacher_forced_logits(ctx, ref), None, "every prompt position's logits"
        with torch.inference_mode():
            out = fn()
        out = out.full_tensor() if hasattr(out, "full_tensor") else out
        return out, None, "every prompt position's logits"
    if eager and arm.name == Arm.EAGER:
        logits = teacher_forced_logits(ctx, ref)
        return logits, None, "one forward over the prompt and the reference tokens"
    times: list[float] = []
    forced = getattr(fn, "forced_logits", None)
    if forced is not None:
        logits = forced(ref.tokens, step_times=times)
        _step_latency(arm, times)
        return logits, None, "teacher-forced with the eager tokens"
    free = getattr(fn, "free_logits", None)
    if free is not None:
        tokens, logits = free(step_times=times)
        _step_latency(arm, times)
        n = min(_first_difference(tokens, ref.tokens) + 1, int(logits.shape[1]))
        total = int(ref.logits.shape[1])
        basis = (
            f"free-running up to the first differing token: {n} of {total} steps (each fed "
            "the eager tokens; transformers' generate takes no forced tokens)"
        )
        return logits[:, :n], n, basis
    raise RuntimeError(f"the {arm.name} arm exposes no logits to check")


def _step_latency(arm: ArmResult, seconds: list[float] | tuple[float, ...]) -> None:
    """Per-token decode latency percentiles from the gate's untimed pass (issue #45)."""
    from .measure import step_percentiles

    summary = step_percentiles(list(seconds))
    if summary is not None:
        arm.details["step_latency"] = summary


def arm_numerics(ctx: Context, arm: ArmResult, run: Any, ref: Any) -> None:
    """Judge ``arm``'s logits against ``ref`` and record the verdict in ``arm.numerics``.

    ``run`` is the arm's built iteration (what the rounds timed). Never raises: a check
    that cannot run is recorded as ``not checked`` with the reason.
    """
    if arm.name == Arm.EAGER and ref is not None and arm.ok:
        _step_latency(arm, ref.step_seconds)  # the eager reference pass is the eager arm's
    if arm.name == Arm.EAGER or not precheck(ctx, arm, ref):
        return
    assert ref is not None  # precheck
    from .denoiser import DenoiserReference

    if isinstance(ref, DenoiserReference):
        _judge_denoiser(ctx, arm, run, ref)
        return
    try:
        logits, n, basis = arm_logits(ctx, arm, run, ref)
    except Exception as err:  # a check that cannot run is said, never fatal to the arm
        log.warning("%s: numerics not checked: %s", arm.name, err)
        arm.numerics = {"verdict": "not checked", "why": f"{type(err).__name__}: {err}"}
        return
    judge_arm(arm, logits, n, basis, ref)


def _judge_denoiser(ctx: Context, arm: ArmResult, run: Any, ref: Any) -> None:
    """The diffusion regime: the arm's denoising steps against eager's (pypto_bench.denoiser)."""
    from .denoiser import NotCompared, denoiser_logits

    try:
        logits, eager, basis, counts = denoiser_logits(ctx, run, ref)
    except NotCompared as err:
        arm.numerics = {"verdict": "not checked", "why": str(err)}
        return
    except Exception as err:  # a check that cannot run is said, never fatal to the arm
        log.warning("%s: numerics not checked: %s", arm.name, err)
        arm.numerics = {"verdict": "not checked", "why": f"{type(err).__name__}: {err}"}
        return
    judge_arm(arm, logits, None, basis, Reference(ref.regime, ref.dtype, eager))
    if arm.numerics is not None:
        arm.numerics["denoising_steps"] = counts


def precheck(
    ctx: Context, arm: ArmResult, ref: Reference | None, why_none: str | None = None
) -> bool:
    """Whether ``arm`` is to be judged; when not, ``arm.numerics`` says why (exempt, or no
    reference: ``why_none``, by default a regime the gate does not check). A failed arm is
    neither."""
    if not arm.ok:
        return False
    if arm.outputs_differ_by_design:
        arm.numerics = {"verdict": "exempt", "why": arm.outputs_differ_by_design}
        return False
    if ref is None:
        arm.numerics = {
            "verdict": "not checked",
            "why": why_none or f"the {ctx.config.regime} regime's logits are not checked yet",
        }
        return False
    return True


def judge_arm(
    arm: ArmResult,
    logits: Any,
    n: int | None,
    basis: str,
    ref: Reference,
    against: str = NUMERICS_BASIS,
) -> None:
    """The verdict of ``logits`` (an arm's, covering the reference's first ``n`` steps, or
    all) against ``ref``, recorded in ``arm.numerics``. Never raises."""
    from pypto_precision import judge_logits, logit_metrics

    try:
        metrics = logit_metrics(logits, ref.logits if n is None else ref.logits[:, :n])
        against32 = None
        if ref.float32_logits is not None:
            full = ref.float32_logits
            against32 = logit_metrics(logits, full if n is None else full[:, :n])
    except Exception as err:  # a check that cannot run is said, never fatal to the arm
        log.warning("%s: numerics not checked: %s", arm.name, err)
        arm.numerics = {"verdict": "not checked", "why": f"{type(err).__name__}: {err}"}
        return
    floor_kl = ref.floor.kl_max if ref.floor is not None else None
    if against32 is not None and floor_kl is not None:
        # The noise-floor rule: the arm's error against the float32 copy within k x the
        # error eager itself has in this dtype (an arm that rounds differently but no
        # worse passes; one that is 1% off somewhere does not).
        allowed = max(FLOOR_K * floor_kl, FLOOR_MIN_KL.get(ref.dtype, 1e-7))
        words = f"{FLOOR_K:g} x eager's own {ref.dtype} KL {floor_kl:.3g}, both against float32"
        check = judge_logits(against32, ref.dtype, allowed=allowed, basis=words)
    else:
        allowed = GATE_KL_MAX.get(ref.dtype, GATE_KL_MAX["float32"])
        words = f"the gate's {ref.dtype} allowance"
        check = judge_logits(metrics, ref.dtype, allowed=allowed, basis=words)
    arm.numerics = {
        "verdict": "pass" if check.ok else "fail",
        "against": against,
        "basis": basis,
        "dtype": ref.dtype,
        "allowed_kl_max": check.allowed,
        "floor": floor_kl,
        **({"floor_note": ref.floor_note} if ref.floor_note else {}),
        "metrics": metrics.to_dict(),
        **({"metrics_vs_float32": against32.to_dict()} if against32 is not None else {}),
        "why": check.why,
    }
    if not check.ok:
        log.warning("%s: numerics fail: %s", arm.name, check.why)


def passage_ids(ctx: Context) -> tuple[Any, str | None]:
    """The passage as ``[batch, seq + gen]`` token ids (rows at spread offsets), or (None,
    why not): the text must hold ``--seq + --gen`` tokens, never repeated (a model that
    has seen the text once would copy it)."""
    from importlib.resources import files

    import torch

    text = files("pypto_bench").joinpath("texts", PASSAGE).read_text(encoding="utf-8")
    ids = list(ctx.tokenizer(text, add_special_tokens=False)["input_ids"])
    cfg = ctx.config
    n = cfg.seq + cfg.gen
    if len(ids) < n:
        return None, (
            f"{PASSAGE_NAME} is {len(ids)} tokens here; --seq {cfg.seq} + --gen {cfg.gen} need {n}"
        )
    stride = (len(ids) - n) // (cfg.batch - 1) if cfg.batch > 1 else 0
    rows = [ids[b * stride : b * stride + n] for b in range(cfg.batch)]
    return torch.tensor(rows, dtype=torch.long, device=ctx.device), None


def perplexity(logits: Any, targets: Any) -> float:
    """exp(mean negative log-likelihood of ``targets`` [B, n] under ``logits`` [B, n, V]),
    in float64 on the host; inf when a logit is not finite."""
    import math

    import torch

    lg = logits.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(lg).all()):
        return math.inf
    nll = torch.nn.functional.cross_entropy(
        lg.reshape(-1, lg.shape[-1]), targets.detach().to("cpu").reshape(-1)
    )
    return float(math.exp(float(nll)))


def _eager_perplexity(ctx: Context, passage: Any) -> float:
    import torch

    seq, gen = ctx.config.seq, ctx.config.gen
    with torch.inference_mode():
        logits = ctx.model(
            input_ids=passage, attention_mask=torch.ones_like(passage), use_cache=False
        ).logits
    return perplexity(logits[:, seq - 1 : seq - 1 + gen], passage[:, seq : seq + gen])


class Gate:
    """The numerical gate of one run: the reference, each arm's verdict while the arm is
    built (:meth:`after`), and where a failing arm goes wrong (:meth:`locate`).

    Where it went wrong: an arm with kernel plug-ins is re-run eagerly with its plug-ins
    on (no capture) while it is still built, every module's output recorded on the prompt
    (pypto-precision's :class:`~pypto_precision.Recorder`, tensor mode); after the arms,
    plain eager is recorded the same way and the two compared (pypto-precision's
    :func:`~pypto_precision.compare_dumps`): a module that diverges puts the plug-ins under
    suspicion and names where; none (or an arm without plug-ins) leaves the capture as
    the suspect. The dumps live in a temporary folder, removed by :meth:`close`.
    """

    def __init__(self, ctx: Context, ref: Reference | None) -> None:
        self.ctx = ctx
        self.ref = ref
        self._tmp: Path | None = None  # made on the first dump (most runs need none)
        self._kernel_dumps: dict[str, Path] = {}
        # Perplexity on the passage (decode: the graph arms replay their step on it).
        self.passage: Any = None
        self.perplexity: dict[str, Any] | None = None
        if ref is not None and ref.regime == Regime.DECODE:
            try:
                self.passage, why = passage_ids(ctx)
                if self.passage is None:
                    self.perplexity = {"text": PASSAGE_NAME, "why": why}
                else:
                    self.perplexity = {
                        "text": PASSAGE_NAME,
                        "tokens": int(self.passage.shape[0]) * ctx.config.gen,
                        "eager": _eager_perplexity(ctx, self.passage),
                    }
            except Exception as err:  # a refinement: its failure is said, never fatal
                self.passage = None
                self.perplexity = {"text": PASSAGE_NAME, "why": f"{type(err).__name__}: {err}"}

    @property
    def _dir(self) -> Path:
        import tempfile

        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="pypto-gate-"))
        return self._tmp

    def after(self, arm: ArmResult, run: Any) -> None:
        """The ``after(arm, run)`` callback the schedules call with each arm still built."""
        arm_numerics(self.ctx, arm, run, self.ref)
        num = arm.numerics
        if num is None:
            return
        if num.get("verdict") in ("pass", "fail") and self.perplexity is not None:
            num["perplexity"] = self._arm_perplexity(run)
        if num.get("verdict") == "fail" and arm.details.get("plugins"):
            folder = self._dir / f"eager-with-{len(self._kernel_dumps)}"
            try:
                dump_modules(self.ctx, folder, f"eager with {arm.name}'s plug-ins")
                self._kernel_dumps[arm.name] = folder
            except Exception as err:  # the locator is a help: its failure is said
                num["suspect"] = {"what": "unknown", "why": f"locator failed: {err}"}

    def _arm_perplexity(self, run: Any) -> dict[str, Any]:
        """This arm's perplexity on the passage beside eager's (teacher-forced replays)."""
        out = dict(self.perplexity or {})
        forced = getattr(getattr(run, "__wrapped__", run), "forced_logits", None)
        if self.passage is None or "eager" not in out:
            return out
        if forced is None:
            out["why"] = "not measured for this arm: it takes no forced tokens"
            return out
        seq, gen = self.ctx.config.seq, self.ctx.config.gen
        try:
            logits = forced(self.passage[:, seq : seq + gen], prompt=self.passage[:, :seq])
            out["arm"] = perplexity(logits, self.passage[:, seq : seq + gen])
            out["ratio_to_eager"] = out["arm"] / out["eager"] if out["eager"] else None
        except Exception as err:
            out["why"] = f"not measured: {type(err).__name__}: {err}"
        return out

    def locate(self, arms: list[ArmResult]) -> None:
        """Name the suspect of every failing arm (the model as loaded: no arm's state)."""
        failing = [a for a in arms if (a.numerics or {}).get("verdict") == "fail"]
        if not failing:
            return
        plain: Path | None = None
        for arm in failing:
            num = arm.numerics or {}
            if "suspect" in num:
                continue
            dump = self._kernel_dumps.get(arm.name)
            if arm.name == Arm.HF_COMPILE:
                # The peer's recipe, not ours: a divergence there is transformers' to answer.
                num["suspect"] = {
                    "what": "transformers' own compile recipe",
                    "why": "the hf-compile arm is transformers' generate with its static "
                    "cache and torch.compile (the peer pypto-bench compares against, not "
                    "pypto-capture's graph): its logits differ from eager's",
                }
                continue
            if dump is None:
                num["suspect"] = {
                    "what": "the capture",
                    "why": "the arm runs no kernel plug-in: eager's own modules, captured, "
                    "give other logits than eager",
                }
                continue
            try:
                if plain is None:
                    plain = self._dir / "eager"
                    dump_modules(self.ctx, plain, "eager")
                num["suspect"] = _kernel_suspect(arm, dump, plain)
            except Exception as err:
                num["suspect"] = {"what": "unknown", "why": f"locator failed: {err}"}

    def close(self) -> None:
        import shutil

        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def dump_modules(
    ctx: Context, folder: Path, arm: str, *, model: Any = None, with_inputs: bool = False
) -> None:
    """Every module's output (and inputs, ``with_inputs``) of one eager forward of the
    prompt's first row by ``model`` (default: the context's), recorded into ``folder``."""
    import torch

    from pypto_precision import Recorder

    model = ctx.model if model is None else model
    param = next(model.parameters(), None)
    device = param.device if param is not None else ctx.input_ids.device
    ids = ctx.input_ids[:1].to(device)
    meta = {"input_ids": ids.tolist(), "arm": arm}
    recorder = Recorder(model, folder, mode="tensor", meta=meta, with_inputs=with_inputs)
    with torch.inference_mode(), recorder:
        model(input_ids=ids, attention_mask=ctx.attention_mask[:1].to(device), use_cache=False)


def _kernel_suspect(arm: ArmResult, with_kernels: Path, plain: Path) -> dict[str, Any]:
    from pypto_precision import compare_dumps, read_dump

    result = compare_dumps(read_dump(with_kernels), read_dump(plain))
    first = result.first_divergent
    plugins = list(arm.details.get("plugins") or [])
    if first is None:
        return {
            "what": "the capture",
            "plugins": plugins,
            "why": "eager with the same plug-ins matches plain eager in every module: the "
            "capture changes the numbers",
        }
    return {
        "what": "the kernel plug-ins",
        "plugins": plugins,
        "first_diverging_module": first.module,
        "why": f"eager with {', '.join(plugins)} on (no capture) diverges from plain eager "
        f"first at {first.module} ({first.verdict.why})",
    }
