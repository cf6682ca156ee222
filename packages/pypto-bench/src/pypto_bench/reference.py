"""``pypto-bench run --reference DEVICE``: is the target device's eager arm right at all?

The numerical gate (pypto_bench.numerics) holds every arm to eager on the same device and
dtype; it cannot see a device whose eager numbers are already wrong (a kernel of the
device's own library, a dtype the device rounds differently). This check answers that in
the same run, as ``pypto-precision check`` does on its own: the target's eager logits,
teacher-forced on eager's own tokens, against a trusted reference (the same folder on
``DEVICE``, float64 for models under 1 GB of weights at float64, else float32), judged by
the noise-floor rule (pypto_precision.judge_logits: KL max within k x what the target's
dtype shows on the reference device against the reference, a fresh load even when the
reference device is the target's, so the run's own model is what is judged). When it fails, every module of the target, the
reference and the floor is recorded on the prompt (inputs too) and the first diverging
module named.

Never raises: a check that cannot run is ``not checked`` with the reason. The models are
loaded one at a time after the arms ran, and freed before the next.
"""

from __future__ import annotations

import gc
import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .config import Regime
from .protocol import Context

__all__ = ["FLOAT64_REFERENCE_BELOW", "loaded_in", "reference_check", "reference_dtype"]

log = logging.getLogger(__name__)

#: Models with fewer weight bytes (at float64) than this get a float64 reference.
FLOAT64_REFERENCE_BELOW = 1 << 30


def reference_dtype(model_path: Path) -> str:
    """float64 for a model under 1 GB of weights at float64, else float32."""
    from .multi.fit import checkpoint_bytes

    # (checkpoint_bytes knows the bench's dtypes: float32 bytes x 2 is the float64 size)
    need = checkpoint_bytes(model_path, "float32")
    return "float64" if need is not None and 2 * need < FLOAT64_REFERENCE_BELOW else "float32"


@contextmanager
def loaded_in(
    path: Any,
    device: Any,
    dtype: str,
    *,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> Iterator[Any]:
    """``path`` loaded (pypto_bench.loading.load_model) on ``device`` in ``dtype``; float64,
    not a bench dtype, is loaded float32 (exact for fp32 / bf16 / fp16 checkpoints) and
    widened. On exit the holder is emptied and collected, so a check that loads three or
    four copies one after the other never holds two (a 0.5B check held 16 GB without)."""
    import torch

    from .loading import load_model

    loaded = load_model(
        path,
        device=device,
        dtype="float32" if dtype == "float64" else dtype,
        trust_remote_code=trust_remote_code,
        attn_implementation=attn_implementation,
    )
    if dtype == "float64":
        loaded.model.to(torch.float64)
    try:
        yield loaded
    finally:
        loaded.model = None
        loaded.tokenizer = None
        del loaded
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


@contextmanager
def _loaded(ctx: Context, device: Any, dtype: str) -> Iterator[Any]:
    """The run's folder, as the run loaded it, on ``device`` in ``dtype``: its model."""
    cfg = ctx.config
    with loaded_in(
        cfg.model_path, device, dtype, trust_remote_code=cfg.trust_remote_code,
        attn_implementation=cfg.attn_implementation,
    ) as loaded:  # fmt: skip
        yield loaded.model


def reference_check(ctx: Context, ref: Any = None) -> dict[str, Any]:
    """The check's record for the report (``report.reference_check``); ``ref``: the gate's
    eager reference of this run (taken here when None). Never raises."""
    device = str(ctx.config.reference)
    if ctx.config.regime not in (Regime.DECODE, Regime.PREFILL):
        return {
            "verdict": "not checked",
            "device": device,
            "why": f"the {ctx.config.regime} regime's logits are not compared with a reference",
        }
    try:
        return _check(ctx, ref, device)
    except Exception as err:  # a check that cannot run is said, never fatal to the run
        log.warning("reference check not run: %s", err)
        why = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        return {"verdict": "not checked", "device": device, "why": why}


def _check(ctx: Context, ref: Any, device_spec: str) -> dict[str, Any]:

    from pypto_capture import resolve_device
    from pypto_precision import judge_logits, logit_metrics

    from .numerics import FLOOR_K, eager_reference, teacher_forced_logits

    ref = ref if ref is not None else eager_reference(ctx, floor=False)
    device = resolve_device(device_spec)
    if not ctx.config.model_path:
        raise ValueError("no model folder to load the reference from")
    path = Path(ctx.config.model_path)
    ref_dtype = reference_dtype(path)
    target_dtype = ref.dtype
    target = teacher_forced_logits(ctx, ref).float().cpu()
    with _loaded(ctx, device, ref_dtype) as model:
        reference = teacher_forced_logits(ctx, ref, model).float().cpu()
    # The floor is a fresh load in the target's dtype, also on the target's own device: the
    # run's model is what is judged (a wrong target never excuses itself as the floor).
    with _loaded(ctx, device, target_dtype) as model:
        floor = teacher_forced_logits(ctx, ref, model).float().cpu()
    metrics = logit_metrics(target, reference)
    floor_metrics = logit_metrics(floor, reference)
    verdict = judge_logits(metrics, target_dtype, floor=floor_metrics, k=FLOOR_K)
    record: dict[str, Any] = {
        "verdict": "pass" if verdict.ok else "fail",
        "device": str(device),
        "dtype": ref_dtype,
        "target": {"device": str(ctx.device), "dtype": target_dtype},
        "floor": {"device": str(device), "dtype": target_dtype},
        "basis": "the eager arm's logits, teacher-forced on its own tokens",
        "allowed_kl_max": verdict.allowed,
        "metrics": metrics.to_dict(),
        "floor_metrics": floor_metrics.to_dict(),
        "why": verdict.why,
    }
    if not verdict.ok:
        try:
            record["first_diverging_module"] = _locate(ctx, device, ref_dtype, target_dtype)
        except Exception as err:  # the locator is a help: its failure is said
            record["locate_failed"] = f"{type(err).__name__}: {err}"[:300]
    return record


def _locate(ctx: Context, device: Any, ref_dtype: str, target_dtype: str) -> str | None:
    """Every module of target, reference and floor recorded on the prompt's first row (inputs
    too) and compared: the first diverging module, or None."""
    import shutil

    from pypto_precision import compare_dumps, read_dump

    from .numerics import dump_modules

    tmp = Path(tempfile.mkdtemp(prefix="pypto-reference-"))
    try:
        dump_modules(ctx, tmp / "target", "eager (target)", with_inputs=True)
        with _loaded(ctx, device, ref_dtype) as model:
            dump_modules(ctx, tmp / "reference", "reference", model=model, with_inputs=True)
        with _loaded(ctx, device, target_dtype) as model:
            dump_modules(ctx, tmp / "floor", "floor", model=model, with_inputs=True)
        result = compare_dumps(
            read_dump(tmp / "target"), read_dump(tmp / "reference"), floor=read_dump(tmp / "floor")
        )
        first = result.first_divergent
        return first.module if first is not None else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
