"""The smoke gate: does this model folder load offline and say something sane?

It runs before any timing so a broken port (NaN logits, a kernel that returns zeros,
a missing remote-code flag) fails in seconds with a specific exit code instead of
producing a throughput number for garbage.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pypto_common import redact

from .coherence import coherence_score, degenerate_reason
from .errors import EXIT, BenchError
from .vision import DEFAULT_IMAGE_PROMPT

__all__ = [
    "DEFAULT_MIN_COHERENCE",
    "DEFAULT_PROMPT",
    "THROUGHPUT_ONLY_HINT",
    "SmokeResult",
    "smoke",
]

log = logging.getLogger(__name__)

DEFAULT_PROMPT = "The capital of France is"
DEFAULT_MIN_COHERENCE = 0.5

#: Appended to a degenerate-output failure: random-weight models (tests, a fresh port
#: before its weights are in) fail the gate by design, and the user needs the way on.
THROUGHPUT_ONLY_HINT = "for a throughput-only run of random weights, pass --skip smoke (pypto-e2e) or run `pypto-bench run` directly"


@dataclass
class SmokeResult:
    """Outcome of the smoke gate; ``passed`` and ``exit_code`` agree."""

    passed: bool
    exit_code: int
    stage: str  # "load" | "generate" | "check" | "coherence" | "done"
    reason: str | None
    text: str = ""
    prompt: str = ""
    token_ids: list[int] = field(default_factory=list)
    coherence: float | None = None
    strict: bool = False
    min_coherence: float = DEFAULT_MIN_COHERENCE
    logits_finite: bool | None = None
    device: str | None = None
    model_class: str | None = None
    load_seconds: float | None = None
    generate_seconds: float | None = None
    #: How the text was generated: "generate" (autoregressive, greedy) or the diffusion
    #: path the model took (a block-diffusion model has no autoregressive generate).
    generation_path: str | None = None
    #: A vision-language model loaded whole: its class and what ran (``vision.vl_info``);
    #: with --image also the image prompt's figures and ``logits_finite``.
    vl: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def smoke(
    model_path: str | Path | None,
    *,
    prompt: str = DEFAULT_PROMPT,
    max_new_tokens: int = 16,
    device: str | int | None = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    strict: bool = False,
    min_coherence: float = DEFAULT_MIN_COHERENCE,
    image: str | Path | None = None,
    image_prompt: str = DEFAULT_IMAGE_PROMPT,
) -> SmokeResult:
    """Load, generate ``max_new_tokens`` greedily, check the output.

    ``image`` (a vision-language model): after the text generation, one forward of the
    whole model on ``image`` + ``image_prompt`` (built with the folder's processor), whose
    logits must be finite.

    Bad input (missing folder, unknown device, an unreadable image, --image on a model
    without vision) raises; every failure of the model itself is a ``SmokeResult`` with
    ``passed=False`` so callers can report it uniformly.
    """
    from .environment import open_device, prepare_device_env
    from .errors import BadInputError
    from .loading import auto_class_name, check_model_folder, load_model, read_model_config

    if max_new_tokens < 1:
        raise BadInputError(f"--max-new-tokens must be >= 1 (got {max_new_tokens})")
    folder = check_model_folder(model_path)
    picture = None
    if image is not None:
        from .vision import read_image

        picture = read_image(image)
        auto_class_name(read_model_config(folder), image=True, path=folder)
    prepare_device_env(device)
    dev = open_device(device)

    result = SmokeResult(
        passed=False,
        exit_code=EXIT.LOAD_FAILED,
        stage="load",
        reason=None,
        prompt=prompt,
        strict=strict,
        min_coherence=min_coherence,
        device=str(dev),
    )
    try:
        loaded = load_model(
            model_path,
            device=dev,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            attn_implementation=attn_implementation,
            image=picture is not None,
        )
    except BadInputError:
        raise
    except BenchError as err:
        result.reason = redact(str(err))
        return result
    result.model_class = type(loaded.model).__name__
    result.load_seconds = round(loaded.load_seconds, 4)
    prompter = None
    if picture is not None:
        from .vision import load_image_prompter

        # A folder without a usable processor is bad input (or a missing package), not a
        # broken model: raised (BadInputError / EnvironmentMissingError), like a bad image.
        prompter = load_image_prompter(
            loaded.path, loaded.config, loaded.tokenizer, trust_remote_code=trust_remote_code
        )
    if loaded.vision_language:
        from .vision import vl_info

        result.vl = vl_info(loaded.model)

    if not _generation_stage(result, loaded, prompt, max_new_tokens, dev):
        return result
    with_image = picture is not None and prompter is not None
    if with_image and not _image_stage(result, loaded.model, prompter, picture, image_prompt, dev):
        return result
    _check_stage(result, strict, min_coherence)
    return result


def _generation_stage(
    result: SmokeResult, loaded: Any, prompt: str, max_new_tokens: int, dev: Any
) -> bool:
    """Generate greedily into ``result``; False (reason set) when the generation failed."""
    result.stage, result.exit_code = "generate", EXIT.GENERATION_FAILED
    try:
        ids, finite, seconds, result.generation_path = _generate(
            loaded.model, loaded.tokenizer, prompt, max_new_tokens, dev
        )
    except Exception as err:
        result.reason = redact(
            f"generation failed: {type(err).__name__}: {' '.join(str(err).split())[:300]}"
        )
        return False
    result.generate_seconds = round(seconds, 4)
    result.logits_finite = finite
    result.token_ids = ids
    result.text = loaded.tokenizer.decode(ids, skip_special_tokens=True)
    if not finite:
        result.reason = "generation produced non-finite logits (NaN/Inf): check dtype and kernels"
        return False
    return True


def _image_stage(
    result: SmokeResult, model: Any, prompter: Any, picture: Any, image_prompt: str, dev: Any
) -> bool:
    """One forward on the image prompt into ``result``; False (reason set) on a failure."""
    try:
        info, image_finite = _image_forward(model, prompter, picture, image_prompt, dev)
    except Exception as err:
        result.reason = redact(
            f"the image prompt's forward failed: {type(err).__name__}: "
            f"{' '.join(str(err).split())[:300]}"
        )
        return False
    result.vl = info
    if not image_finite:
        result.reason = (
            "the image prompt produced non-finite logits (NaN/Inf): check dtype and the "
            "vision tower's kernels"
        )
        return False
    return True


def _check_stage(result: SmokeResult, strict: bool, min_coherence: float) -> None:
    """The degenerate-output check and (``strict``) the coherence floor on ``result``."""
    result.stage, result.exit_code = "check", EXIT.DEGENERATE
    reason = degenerate_reason(result.token_ids, result.text)
    result.coherence = coherence_score(result.text)
    if reason is not None:
        result.reason = f"{reason}; {THROUGHPUT_ONLY_HINT}"
        return
    if strict and result.coherence < min_coherence:
        result.stage, result.exit_code = "coherence", EXIT.LOW_COHERENCE
        result.reason = f"coherence score {result.coherence:.2f} < {min_coherence:.2f} (--strict)"
        return
    result.passed, result.exit_code, result.stage = True, EXIT.OK, "done"


def _image_forward(
    model: Any, prompter: Any, picture: Any, text: str, device: Any
) -> tuple[dict[str, Any], bool]:
    """One forward of the whole VL model on the image prompt: (``vl`` info, logits finite)."""
    import inspect

    import torch

    from .vision import vl_info

    accepted = set(inspect.signature(model.forward).parameters)
    dtype = next(model.parameters()).dtype
    inputs: dict[str, Any] = {}
    for key, value in prompter.inputs(picture.image, text, 1, accepted).items():
        if isinstance(value, torch.Tensor):
            value = value.to(device)
            if value.is_floating_point():
                value = value.to(dtype)
        inputs[key] = value
    start = time.perf_counter()
    with torch.inference_mode():
        logits = model(**inputs, use_cache=False).logits
    seconds = time.perf_counter() - start
    finite = bool(torch.isfinite(logits).all())
    info = vl_info(model, image=picture, prompter=prompter, inputs=inputs)
    info["image"]["logits_finite"] = finite
    info["image"]["forward_seconds"] = round(seconds, 4)
    info["image"]["prompt"] = text
    return info, finite


def _generate(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int, device: Any):
    import torch

    from .diffusion import supports_diffusion

    if supports_diffusion(model):
        return _diffusion_text(model, tokenizer, prompt, max_new_tokens, device)
    enc = tokenizer(prompt, return_tensors="pt")
    input_ids = enc["input_ids"].to(device)
    attention_mask = enc.get("attention_mask")
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=tokenizer.pad_token_id,
        )
    seconds = time.perf_counter() - start
    finite = all(bool(torch.isfinite(step).all()) for step in (out.logits or ()))
    new = out.sequences[0, input_ids.shape[1] :].tolist()
    # Pad after EOS is not output: cut at the first EOS (kept out of the text anyway).
    eos = tokenizer.eos_token_id
    if eos is not None and eos in new:
        new = new[: new.index(eos)]
    return new, finite, seconds, "generate"


def _diffusion_text(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int, device: Any):
    """A block-diffusion model's answer through its own generation (one step per position).

    Such a model cannot be smoke-tested with ``generate``: LLaDA2's forward needs a 4-D
    block mask (the published code raises on a plain ``model(ids)``) and its text comes from
    a denoising loop. The diffusion protocol (or a native class's own ``generate``) runs
    it; the answer is then checked like any other.
    """
    import torch

    from .diffusion import diffusion_generate

    ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = diffusion_generate(model, ids, gen_length=max_new_tokens, steps=max_new_tokens)
    seconds = time.perf_counter() - start
    new = out.sequences[0, ids.shape[1] :].tolist()
    eos = tokenizer.eos_token_id
    if eos is not None and eos in new:
        new = new[: new.index(eos)]
    mask_id = getattr(model.config, "mask_token_id", None)
    new = [t for t in new if t != mask_id]
    return new, out.logits_finite is not False, seconds, out.path or "diffusion_generate"
