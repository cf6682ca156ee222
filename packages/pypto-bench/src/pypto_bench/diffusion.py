"""The diffusion-generate regime's model side: the protocol (contract D) and native classes.

Two kinds of model run in the regime, and the report says which path ran:

* **protocol** models have::

      def diffusion_generate(self, input_ids, *, gen_length, steps, block_length=None,
                             forward=None, **kwargs) -> DiffusionOutput-like

  returning an object or dict with ``sequences`` (LongTensor [B, prompt + gen_length])
  and ``num_denoising_steps`` (int: forward passes whose predictions were used, the NFE).
  ``steps`` is the whole generation's budget. Optional answer fields, read when present:
  ``num_forward_passes`` (all forwards, cache fills included), ``steps_per_block``,
  ``path`` (which implementation ran), ``logits_finite``, ``capture_s``.
  Optional keywords, passed only when the method names them: ``step_backend`` (a
  pypto-capture graph backend: the model captures its own fixed-shape step, e.g. one
  block against a KV cache), ``ignore_eos`` (generate every position) and
  ``step_observer`` (called as ``step_observer(input_ids, logits)`` after every denoising
  step's forward: the numerical gate's view of the denoiser, pypto_bench.denoiser). Without
  ``step_backend`` the graph arm passes ``forward``: a callable ``forward(input_ids [B, L])
  -> logits [B, L, V]`` (a captured whole-sequence forward) the model uses for every
  denoising step; a model that ignores it still runs (``forward_used: false``).
  pypto-models-llada2's ``LLaDA2MoeModelLM`` and pypto-testing's tiny diffusion model
  implement it.
* **native** models are transformers' own block-diffusion classes (5.24:
  ``DiffusionGemmaForBlockDiffusion``): their ``generate()`` is the diffusion loop, driven
  here through that API (``max_new_tokens``, ``max_denoising_steps`` per canvas). The graph
  arm runs the same ``generate`` on its static cache with the model's own compilation off,
  and one denoising step (the decoder forward over a canvas) captured once by a
  pypto-capture backend (:class:`CapturedDenoiserStep`) and replayed for every step of
  every canvas; the encoder (once per canvas) and the sampler stay eager, so both arms draw
  the same random numbers and, seeded alike, their tokens are compared.

Why not the model's own static path (``cache_implementation="static"``): it compiles five
functions (encoder, the decoder forward twice since the first step of a canvas passes no
self-conditioning logits, and the sampler's accept and renoise steps, with inductor's RNG
instead of eager's, so its samples no longer follow the eager arm's); on the tiny test model
that is 5 graphs and a 66 s first call (cold inductor cache; 362 s reported on a real
checkpoint) against 34 s for the captured step (measured back to back on 2 shared CPU
cores), the rest being inductor compiling that one graph. The captured step is one graph: the
first step's "no self-conditioning" is passed as ``self_conditioning_mask`` all False,
which the decoder turns into the same zero signal.

Counting is honest and the same for both: per row, the generated positions up to and
including the first EOS (all of them with ``ignore_eos``), without mask or pad tokens the
model left unfilled; the prompt is never counted (the seed harness subtracted it twice).
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "CapturedDenoiserStep",
    "DiffusionOutput",
    "captures_own_step",
    "count_generated",
    "diffusion_generate",
    "native_block_diffusion",
    "normalise_output",
    "observes_steps",
    "read_diffusion_output",
    "supports_diffusion",
    "supports_protocol",
    "unsupported_message",
]


def _explicit_params(fn: Any) -> set[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD}


def native_block_diffusion(model: Any) -> bool:
    """True for transformers' own block-diffusion classes (``generate`` is a diffusion loop)."""
    for cls in type(model).__mro__:
        name = cls.__name__
        if name.endswith("ForBlockDiffusion") or name.endswith("DiffusionGenerationMixin"):
            return callable(getattr(model, "generate", None))
    return False


def supports_protocol(model: Any) -> bool:
    return callable(getattr(model, "diffusion_generate", None))


def supports_diffusion(model: Any) -> bool:
    return supports_protocol(model) or native_block_diffusion(model)


def captures_own_step(model: Any) -> bool:
    """The model's ``diffusion_generate`` takes ``step_backend`` (it captures its own step)."""
    return supports_protocol(model) and "step_backend" in _explicit_params(model.diffusion_generate)


def unsupported_message(model: Any) -> str:
    return (
        f"regime diffusion-generate is not supported by this model ({type(model).__name__}): "
        "it has no diffusion_generate() and is not a transformers block-diffusion class; "
        "pick --regime decode or prefill"
    )


@dataclass
class DiffusionOutput:
    """One generation's answer, normalised (see the module docstring for the fields)."""

    sequences: torch.Tensor
    num_denoising_steps: int | None
    num_forward_passes: int | None = None
    steps_per_block: list[int] | None = None
    path: str | None = None
    logits_finite: bool | None = None
    capture_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_OPTIONAL = ("num_forward_passes", "steps_per_block", "path", "logits_finite", "capture_s")


def read_diffusion_output(out: Any) -> tuple[torch.Tensor, int | None]:
    """(sequences, num_denoising_steps) from an object or a dict."""
    full = normalise_output(out)
    return full.sequences, full.num_denoising_steps


def normalise_output(out: Any) -> DiffusionOutput:
    """A :class:`DiffusionOutput` from a protocol answer (object or dict)."""

    def get(name: str) -> Any:
        return out.get(name) if isinstance(out, dict) else getattr(out, name, None)

    sequences = out["sequences"] if isinstance(out, dict) else out.sequences
    optional = {name: get(name) for name in _OPTIONAL}
    steps = optional["steps_per_block"]
    return DiffusionOutput(
        sequences=sequences,
        num_denoising_steps=get("num_denoising_steps"),
        num_forward_passes=optional["num_forward_passes"],
        steps_per_block=list(steps) if steps is not None else None,
        path=optional["path"],
        logits_finite=optional["logits_finite"],
        capture_s=optional["capture_s"],
    )


def diffusion_generate(
    model: Any,
    input_ids: torch.Tensor,
    *,
    gen_length: int,
    steps: int,
    block_length: int | None = None,
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
    step_backend: Any = None,
    ignore_eos: bool = False,
    native_step: CapturedDenoiserStep | None = None,
    step_observer: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> DiffusionOutput:
    """Run one generation on a protocol or native model; the answer normalised.

    Why a function: callers (the bench, the smoke gate, pypto-e2e, a model package's own
    tests) read one type whatever the model returns, and optional keywords are only passed
    to models that name them, so models that predate them keep working.
    ``native_step`` (a native model only) runs its static-cache ``generate`` with that
    captured denoising step instead of the model's own compilation. ``step_observer(ids,
    logits)`` sees every denoising step (:func:`observes_steps` says whether the model
    lets it; a protocol model that does not name it is refused).
    """
    if supports_protocol(model):
        kwargs: dict[str, Any] = {
            "gen_length": gen_length,
            "steps": steps,
            "block_length": block_length,
        }
        named = _explicit_params(model.diffusion_generate)
        if forward is not None:
            kwargs["forward"] = forward
        if step_backend is not None:
            if "step_backend" not in named:
                raise TypeError(f"{type(model).__name__}.diffusion_generate takes no step_backend")
            kwargs["step_backend"] = step_backend
        if ignore_eos and "ignore_eos" in named:
            kwargs["ignore_eos"] = True
        if step_observer is not None:
            if "step_observer" not in named:
                raise TypeError(f"{type(model).__name__}.diffusion_generate takes no step_observer")
            kwargs["step_observer"] = step_observer
        return normalise_output(model.diffusion_generate(input_ids, **kwargs))
    if native_block_diffusion(model):
        return _native_generate(
            model,
            input_ids,
            gen_length=gen_length,
            steps=steps,
            block_length=block_length,
            step=native_step,
            observer=step_observer,
        )
    raise TypeError(unsupported_message(model))


def observes_steps(model: Any) -> bool:
    """Whether a denoising step's (input ids, logits) can be observed: a native class (its
    denoiser is the model's own forward, called with ``decoder_input_ids``) or a protocol
    model whose ``diffusion_generate`` names ``step_observer``."""
    if supports_protocol(model):
        return "step_observer" in _explicit_params(model.diffusion_generate)
    return native_block_diffusion(model)


@contextlib.contextmanager
def _observed_denoiser(model: Any, observer: Callable[..., None] | None) -> Iterator[None]:
    """A native model's denoising steps handed to ``observer``: ``model.forward`` as it is
    now (the model's own, or a captured step installed in its place) wrapped for the block,
    since ``generate`` calls ``self.forward`` with ``decoder_input_ids`` (no module hook
    fires there); the encoder's calls pass none and are not observed."""
    if observer is None:
        yield
        return
    inner = model.forward
    previous = model.__dict__.get("forward")

    def forward(*args: Any, **kwargs: Any) -> Any:
        out = inner(*args, **kwargs)
        ids = kwargs.get("decoder_input_ids")
        logits = getattr(out, "logits", None)
        if ids is not None and logits is not None:
            observer(ids, logits)
        return out

    model.forward = forward
    try:
        yield
    finally:
        if previous is None:
            del model.forward
        else:
            model.forward = previous


def _native_generate(
    model: Any,
    input_ids: torch.Tensor,
    *,
    gen_length: int,
    steps: int,
    block_length: int | None,
    step: CapturedDenoiserStep | None,
    observer: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> DiffusionOutput:
    """transformers' own block-diffusion ``generate`` (DiffusionGemma's API)."""
    from .errors import BadInputError

    canvas = getattr(model.config, "canvas_length", None)
    name = type(model).__name__
    if canvas is None:
        raise BadInputError(f"{name} has no config.canvas_length: cannot size its denoising steps")
    if block_length is not None and int(block_length) != int(canvas):
        raise BadInputError(
            f"{name} generates canvases of {canvas} tokens (config.canvas_length): "
            f"drop --block-length or pass --block-length {canvas}"
        )
    canvases = math.ceil(gen_length / canvas)
    per_canvas = max(1, int(steps) // canvases)
    kwargs: dict[str, Any] = {
        "max_new_tokens": gen_length,
        "max_denoising_steps": per_canvas,
        "return_dict_in_generate": True,
    }
    if step is None:
        with _observed_denoiser(model, observer):
            out = model.generate(input_ids, **kwargs)
        how = "dynamic cache, eager"
    else:
        # The static cache gives every step one shape; the model's own compilation is off
        # (the captured step replaces its compiled decoder forward).
        kwargs["cache_implementation"] = "static"
        kwargs["disable_compile"] = True
        with step.installed(model), _observed_denoiser(model, observer):
            out = model.generate(input_ids, **kwargs)
        how = (
            f"static cache; one denoising step captured ({step.backend_name}) and replayed "
            "for every step and canvas; encoder and sampler eager"
        )
    sequences = out.sequences
    nfe = _native_forwards(
        out, sequences, input_ids.shape[1], getattr(model.generation_config, "pad_token_id", None)
    )
    return DiffusionOutput(
        sequences=sequences,
        num_denoising_steps=nfe,
        path=f"native {name}.generate ({how})",
        extra={"max_denoising_steps_per_canvas": per_canvas, "canvas_length": int(canvas)},
    )


def _native_forwards(
    out: Any, sequences: torch.Tensor, prompt_len: int, pad_id: int | None
) -> int | None:
    """Denoising forwards of a native generate: rows' valid tokens / their tokens per forward.

    DiffusionGemma reports only ``tokens_per_forward`` per row (valid tokens / forwards
    that row needed); the batch runs as many forwards as its slowest row.
    """
    tpf = getattr(out, "tokens_per_forward", None)
    if tpf is None:
        return None
    new = sequences[:, prompt_len:]
    valid = (
        (new != pad_id).sum(dim=-1)
        if pad_id is not None
        else torch.full((new.shape[0],), new.shape[1])
    )
    passes = []
    for v, t in zip(valid.tolist(), torch.as_tensor(tpf).reshape(-1).tolist(), strict=False):
        if t and math.isfinite(t) and t > 0:
            passes.append(round(v / t))
    return max(passes) if passes else None


class _Logits:
    """What ``generate`` reads off a decoder forward (``.logits``)."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class CapturedDenoiserStep:
    """One denoising step of a native block-diffusion model, captured once and replayed.

    Installed (:meth:`installed`) as the model's ``forward`` while its static-cache
    ``generate`` runs with compilation off: every decoder call of every canvas copies its
    inputs (canvas ids, self-conditioning logits, the decoder's 4D masks, positions) into
    fixed buffers and replays the step; the static cache is read in place (the encoder
    writes it between canvases). The first step of a canvas has no self-conditioning
    logits: the step passes ``self_conditioning_mask`` all False, which the decoder turns
    into the same zero signal, so one graph serves every step. Any other call of
    ``forward`` (none in ``generate``) goes to the model's own.

    The logits are returned as a copy: ``generate`` keeps the previous step's logits
    (self-conditioning, the stopping criteria) while the next replay overwrites the
    graph's output.
    """

    def __init__(self, model: Any, backend: Any) -> None:
        self.model = model
        self.backend = backend
        self.backend_name = str(getattr(backend, "label", getattr(backend, "name", backend)))
        self.captures = 0
        self.replays = 0
        self.capture_s: float | None = None
        self._captured: Any = None
        self._cache: Any = None
        self._buffers: dict[str, Any] = {}
        self._masks: dict[str, Any] = {}

    @contextlib.contextmanager
    def installed(self, model: Any) -> Iterator[None]:
        """``model.forward`` is this step for the block (the instance attribute removed after)."""
        if model is not self.model:
            raise ValueError("a CapturedDenoiserStep is installed on the model it was made for")
        had = "forward" in vars(model)
        previous = vars(model).get("forward")
        model.forward = self
        try:
            yield
        finally:
            if had:
                model.forward = previous
            else:
                del model.forward

    def describe(self) -> dict[str, Any]:
        """What was captured and how often (the report's ``details.diffusion.capture``)."""
        return {
            "what": "one denoising step (the decoder forward over a canvas against the static "
            "cache), captured once and replayed; encoder and sampler eager",
            "backend": self.backend_name,
            "captures": self.captures,
            "replays": self.replays,
            "capture_s": self.capture_s,
        }

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ids = kwargs.get("decoder_input_ids")
        if args or ids is None:
            # not a denoising step (nothing in generate calls forward that way)
            return type(self.model).forward(self.model, *args, **kwargs)
        import time

        from pypto_capture import synchronize

        cache = kwargs.pop("cache", None)
        masks = kwargs.pop("decoder_attention_mask", None)
        logits = kwargs.pop("self_conditioning_logits", None)
        positions = kwargs.pop("decoder_position_ids", None)
        kwargs.pop("decoder_input_ids")
        extra = sorted(k for k, v in kwargs.items() if v is not None)
        if extra or cache is None or not isinstance(masks, dict) or positions is None:
            raise RuntimeError(
                "the captured denoising step takes the canvas, its static cache, 4D decoder "
                "masks and positions only; this call also passed "
                f"{', '.join(extra) or 'no cache, masks or positions'}: run the eager arm"
            )
        if self._captured is None:
            start = time.perf_counter()
            self._allocate(ids, cache, masks, positions)
            self._load(ids, cache, masks, logits, positions)
            self._captured = self.backend.capture(self._step, warmup=1)
            synchronize(self.backend.device)
            self.capture_s = time.perf_counter() - start
            self.captures += 1
        else:
            self._load(ids, cache, masks, logits, positions)
        self.replays += 1
        return _Logits(self._captured.replay().clone())

    def _allocate(self, ids: Any, cache: Any, masks: dict[str, Any], positions: Any) -> None:
        text = self.model.config.get_text_config()
        embed = self.model.get_input_embeddings().weight
        batch, canvas = ids.shape
        self._cache = cache
        self._buffers = {
            "ids": torch.empty_like(ids),
            "logits": torch.zeros(
                batch, canvas, int(text.vocab_size), dtype=embed.dtype, device=ids.device
            ),
            "use_logits": torch.zeros(batch, dtype=torch.bool, device=ids.device),
            "positions": torch.empty_like(positions),
        }
        self._masks = {k: (None if v is None else torch.empty_like(v)) for k, v in masks.items()}

    def _load(
        self, ids: Any, cache: Any, masks: dict[str, Any], logits: Any, positions: Any
    ) -> None:
        if cache is not self._cache:
            raise RuntimeError(
                "generate handed the captured denoising step a new cache (a different batch "
                "or length): the step replays against the cache it was captured with"
            )
        buf = self._buffers
        self._copy("decoder_input_ids", buf["ids"], ids)
        self._copy("decoder_position_ids", buf["positions"], positions)
        if logits is None:
            buf["use_logits"].fill_(False)
        else:
            self._copy("self_conditioning_logits", buf["logits"], logits)
            buf["use_logits"].fill_(True)
        if set(masks) != set(self._masks):
            raise RuntimeError(
                f"decoder masks changed from {sorted(self._masks)} to {sorted(masks)} "
                "between denoising steps"
            )
        for kind, target in self._masks.items():
            source = masks[kind]
            if (target is None) != (source is None):
                raise RuntimeError(
                    f"the decoder's {kind} mask was {'absent' if target is None else 'present'} "
                    "at capture and is not now: the captured step cannot replay it"
                )
            if target is not None:
                self._copy(f"{kind} mask", target, source)

    @staticmethod
    def _copy(name: str, target: Any, source: Any) -> None:
        if tuple(source.shape) != tuple(target.shape):
            raise RuntimeError(
                f"{name} of shape {tuple(source.shape)} given to the denoising step captured "
                f"with {tuple(target.shape)}"
            )
        target.copy_(source)

    def _step(self) -> Any:
        buf = self._buffers
        out = type(self.model).forward(
            self.model,
            decoder_input_ids=buf["ids"],
            self_conditioning_logits=buf["logits"],
            self_conditioning_mask=buf["use_logits"],
            decoder_attention_mask=dict(self._masks),
            cache=self._cache,
            decoder_position_ids=buf["positions"],
        )
        return out.logits


def count_generated(
    sequences: torch.Tensor,
    prompt_len: int,
    eos_ids: Sequence[int],
    *,
    unfilled_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    gen_length: int | None = None,
) -> list[int]:
    """Generated tokens per row: after the prompt, up to and including the first EOS.

    With ``ignore_eos`` every generated position counts (up to ``gen_length``). Positions
    still holding an ``unfilled_ids`` token (a mask id, a pad id) before the cut are not
    output and are not counted.
    """
    gen = sequences[:, prompt_len:]
    if ignore_eos and gen_length is not None:
        gen = gen[:, :gen_length]
    from .measure import count_tokens

    eos = {int(e) for e in eos_ids}
    unfilled = {int(u) for u in unfilled_ids}
    rows = gen.tolist()
    # The cut at the first EOS is the decode regime's own rule (one definition).
    cuts = count_tokens(rows, eos_ids, ignore_eos=ignore_eos)
    return [
        sum(1 for tok in row[:n] if tok not in unfilled or tok in eos)
        for row, n in zip(rows, cuts, strict=True)
    ]
