"""Decode-step runner: eager prefill, one captured token step, N in-place replays.

This is what a graph arm in a decode benchmark must time: the *decode* step (one token
in, one token out), not a prefill-shaped forward. The step reads the token buffer,
runs the model against the capture-safe cache, writes the greedy token back into the
same buffer and advances the device-side position in place, so a replay needs no host
work and no new inputs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from . import _hf
from .backends import GraphBackend, make_backend
from .cache import make_capture_safe_cache
from .device import resolve_device, synchronize
from .errors import PyptoCaptureError, UnsupportedModelError
from .mitigations import apply_capture_mitigations, needs_capture_mitigations

log = logging.getLogger(__name__)

__all__ = ["AUTOTUNE_MIN_WEIGHT_BYTES", "DecodeStepRunner", "default_compile_mode"]

#: On CPU a decode step of a model this large (weights read per step) is bandwidth-bound
#: GEMVs, where inductor's autotuned CPU GEMM micro-kernels beat the library GEMMs (0.5B
#: fp32 on 2 cores: 79% -> 96% of the bandwidth ceiling) for a one-off capture cost of
#: tens of seconds. Below it (tiny test models) launch overhead dominates and autotuning
#: only costs capture time.
AUTOTUNE_MIN_WEIGHT_BYTES = 256 * 2**20


def default_compile_mode(model: torch.nn.Module, device: torch.device) -> tuple[str | None, str]:
    """The compile mode a decode capture uses when none was asked for, and why."""
    if device.type != "cpu":
        return None, "inductor's default (not CPU)"
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if weights >= AUTOTUNE_MIN_WEIGHT_BYTES:
        return "max-autotune-no-cudagraphs", (
            f"CPU and {weights / 2**20:.0f} MiB of weights >= "
            f"{AUTOTUNE_MIN_WEIGHT_BYTES // 2**20} MiB: autotuned GEMV kernels"
        )
    return None, (
        f"inductor's default: {weights / 2**20:.1f} MiB of weights < "
        f"{AUTOTUNE_MIN_WEIGHT_BYTES // 2**20} MiB (launch-bound; autotuning would only cost capture time)"
    )


#: Name of the profiler range around each replayed decode step (only under a profiler).
STEP_MARKER = "pypto_capture::step"


class DecodeStepRunner:
    """Greedy decoding with a captured one-token step (see the module docstring).

    ``backend``: "auto" (npugraph on NPU, fused on CUDA, compile on CPU), "npugraph",
    "cudagraph", "compile", "fused" (compile, then capture the compiled step), or "eager" (the same static-cache step without capture, the
    baseline). Prefill runs eagerly through the model's own cache path (bit-identical to
    ``generate``'s prefill) and its keys/values are copied into the capture-safe cache.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        batch_size: int,
        max_cache_len: int,
        backend: str | GraphBackend = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        warmup: int = 2,
        compile_mode: str | None = None,
        mitigations: bool | None = None,
    ):
        if batch_size < 1 or max_cache_len < 2:
            raise PyptoCaptureError(
                f"batch_size must be >= 1 and max_cache_len >= 2 (got {batch_size}, {max_cache_len})"
            )
        mdev, mdtype = _hf.model_device_dtype(model)
        dev = resolve_device(device) if device is not None else mdev
        if dev != mdev or (dtype is not None and dtype != mdtype):
            log.info("moving model to %s / %s for decode", dev, dtype or mdtype)
            model.to(device=dev, dtype=dtype or mdtype)
        self.model = model
        self.device = dev
        self.dtype = dtype or mdtype
        self.batch_size = batch_size
        self.max_cache_len = max_cache_len
        self.warmup = warmup
        if compile_mode is None and not isinstance(backend, GraphBackend):
            compile_mode, self.compile_mode_reason = default_compile_mode(model, dev)
        else:
            self.compile_mode_reason = "asked for" if compile_mode else "the backend's own"
        self.compile_mode = compile_mode
        self.backend = (
            backend
            if isinstance(backend, GraphBackend)
            else make_backend(backend, dev, compile_mode=compile_mode)
        )
        # NPU graphs need eager attention, prebuilt masks and rotary tables; elsewhere the
        # explicit 4D mask and device-side positions already keep the step capture-safe.
        if mitigations is None:
            mitigations = needs_capture_mitigations(self.backend.name, dev.type)
        self.mitigations = (
            apply_capture_mitigations(model, attn="switch", max_positions=max(max_cache_len, 1))
            if mitigations
            else None
        )
        self._cache_kw = _hf.cache_kwarg(model)
        params = _hf.forward_params(model)
        self._logits_kw = "logits_to_keep" if "logits_to_keep" in params else None
        self._mask_mapping = _hf.accepts_mask_mapping(model)
        self.cache: Any = None
        self.tok = torch.zeros(batch_size, 1, dtype=torch.long, device=dev)
        #: The last step's logits ``[B, vocab]`` (the prefill's last position, then each
        #: step's): a fixed buffer the captured step writes, as it writes ``tok``, so a
        #: replay's numbers can be checked (``forced_logits``); allocated by the first prefill.
        self.logits: torch.Tensor | None = None
        self._captured: Any = None
        self._host_pos = 0  # host mirror of the cache position: bookkeeping without syncs
        self.capture_s = 0.0

    @property
    def backend_name(self) -> str:
        """What captures the step; a fused backend names its stages (``fused (compile+cudagraph)``),
        which are final once :meth:`capture` ran (``auto`` may fall back to ``cudagraph``)."""
        return str(getattr(self.backend, "label", self.backend.name))

    @property
    def captured(self) -> bool:
        return self._captured is not None

    # -- prefill ----------------------------------------------------------------
    def _model_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"use_cache": True}
        if self._logits_kw:
            kw[self._logits_kw] = 1
        return kw

    @torch.no_grad()
    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run the prompt eagerly, fill the capture-safe cache, return the first greedy token [B]."""
        if input_ids.dim() != 2 or input_ids.shape[0] != self.batch_size:
            raise PyptoCaptureError(
                f"input_ids must be [batch_size={self.batch_size}, prompt_len], got {tuple(input_ids.shape)}"
            )
        b, p = input_ids.shape
        if p + 1 > self.max_cache_len:
            raise PyptoCaptureError(
                f"prompt of {p} tokens leaves no room in max_cache_len={self.max_cache_len}; raise max_cache_len"
            )
        input_ids = input_ids.to(self.device)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        attention_mask = attention_mask.to(self.device)
        am = attention_mask.long()
        # Only left padding keeps one write slot for every row (what generate uses for decoder-only).
        if bool((am[:, -1] == 0).any()):
            raise PyptoCaptureError(
                "attention_mask must be left-padded (last column all ones) for batched decode"
            )
        position_ids = (am.cumsum(-1) - 1).masked_fill(am == 0, 0)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **self._model_kwargs(),
        )
        prefilled = _hf.output_cache(out)
        if prefilled is None:
            raise UnsupportedModelError(
                f"{type(self.model).__name__} returned no cache object from a use_cache=True "
                "forward (it keeps its decode state inside the model, e.g. RecurrentGemma); "
                "pypto-capture cannot hold that state for a captured step: bench its eager arm"
            )
        own = _hf.model_specific_cache(prefilled)
        if own is not None:
            raise UnsupportedModelError(
                f"{type(self.model).__name__} keeps a cache class of its own ({own}) that its "
                "forward insists on; pypto-capture cannot give it a capture-safe cache: bench "
                "its eager arm"
            )
        if self.cache is None:
            self.cache = make_capture_safe_cache(
                self.model,
                batch_size=b,
                max_cache_len=self.max_cache_len,
                device=self.device,
                prefilled=prefilled,
            )
        self.cache.load_prefill(prefilled, attention_mask)
        self._host_pos = p
        last = out.logits[:, -1, :]
        if self.logits is None or self.logits.shape != last.shape:
            self.logits = torch.empty_like(last)
        self.logits.copy_(last)
        first = last.argmax(-1)
        self.tok.copy_(first.unsqueeze(-1))
        return first

    # -- the captured step -------------------------------------------------------
    def _step(self) -> torch.Tensor:
        cache = self.cache
        mask: Any = (
            cache.decode_masks(self.dtype) if self._mask_mapping else cache.decode_mask(self.dtype)
        )
        out = self.model(
            input_ids=self.tok,
            attention_mask=mask,
            position_ids=cache.decode_position_ids(),
            **{self._cache_kw: cache},
            **self._model_kwargs(),
        )
        last = out.logits[:, -1, :]
        assert self.logits is not None  # prefill ran before any step
        self.logits.copy_(last)
        nxt = last.argmax(-1)
        self.tok.copy_(nxt.unsqueeze(-1))
        cache.advance(1)
        return self.tok

    def _check_model_layout(self) -> None:
        types_ = set(self.cache.layer_types)
        if any(k != "state" for k in self.cache.kinds):
            why = _hf.own_mask_builder(self.model)
            if why:
                raise UnsupportedModelError(
                    f"{type(self.model).__name__} {why}; pypto-capture cannot capture its decode "
                    "step: bench its eager arm (its prefill graph arm runs)"
                )
        if not self._mask_mapping and len(set(self.cache.type_lengths.values())) > 1:
            raise UnsupportedModelError(
                f"{type(self.model).__name__} mixes layer types {sorted(types_)} but its forward takes a "
                "single mask; pypto-capture cannot give each layer type its own mask"
            )

    def capture(self) -> None:
        """Capture (or compile) the one-token step once; raises CaptureFailedError on failure.

        Capturing runs the step during warmup (and torch.compile runs it while tracing), which
        would write cache slots and move the position: the state is snapshotted and restored
        around it, so capture() is safe between prefill() and decode().
        """
        if self._captured is not None:
            return
        fresh = self.cache is None
        if fresh:  # capture before any prompt: prefill a dummy token to size the cache
            self.prefill(torch.zeros(self.batch_size, 1, dtype=torch.long, device=self.device))
        self._check_model_layout()
        snap = self._snapshot()
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                self._captured = self.backend.capture(self._step, warmup=self.warmup)
        finally:
            self._restore(snap)
        self.capture_s = time.perf_counter() - t0
        if fresh:
            self.reset()

    def _state_tensors(self) -> list[torch.Tensor]:
        # The token buffer, the position, every ring and every recurrent state.
        return [self.tok, *self.cache.state_tensors()]

    def _snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in self._state_tensors()]

    def _restore(self, snap: list[torch.Tensor]) -> None:
        tensors = self._state_tensors()
        with torch.no_grad():
            for dst, src in zip(tensors, snap, strict=True):
                dst.copy_(src)

    # -- decode ------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, first_token: torch.Tensor, steps: int) -> torch.Tensor:
        """Replay the captured step ``steps`` times; returns greedy tokens [B, steps].

        ``first_token`` (from prefill) is the input of the first step and is not included.
        Nothing in the loop reads device values on the host.
        """
        if self.cache is None or self._host_pos == 0:
            raise PyptoCaptureError("call prefill() before decode()")
        if steps < 0:
            raise PyptoCaptureError(f"steps must be >= 0, got {steps}")
        if self._host_pos + steps > self.max_cache_len:
            raise PyptoCaptureError(
                f"{steps} steps after {self._host_pos} cached tokens exceed max_cache_len={self.max_cache_len}"
            )
        self.capture()
        tokens = torch.empty(self.batch_size, steps, dtype=torch.long, device=self.device)
        self.tok.copy_(first_token.reshape(self.batch_size, 1).to(self.device))
        step = self._captured
        if torch.autograd._profiler_enabled():
            # Under a profiler (pypto-tune) each replay is one named range, so a trace can
            # tell steps apart; outside one the loop pays nothing for it.
            for i in range(steps):
                with torch.profiler.record_function(STEP_MARKER):
                    out = step.replay()
                    tokens[:, i].copy_(out[:, 0])
        else:
            for i in range(steps):
                out = step.replay()
                tokens[:, i].copy_(out[:, 0])
        self._host_pos += steps
        return tokens

    @torch.no_grad()
    def forced_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        tokens: torch.Tensor,
        step_times: list[float] | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits ``[B, n, vocab]`` of this runner over ``tokens`` ``[B, n]``.

        Why: free-running greedy tokens are a weak check (one flipped token and every later
        position differs; a 1% error can leave every argmax unchanged). Here step 0 is the
        prefill's last logits and step ``i`` the captured step replayed on ``tokens[:, i-1]``,
        so each step is fed the reference's tokens and judged on its own. The cache is
        rewound first; the timed iterations rewind it again. ``step_times`` receives each
        replay's seconds, the device synchronized around it (per-token latency
        percentiles, from this pass rather than the timed ones, which never synchronize
        inside the loop).
        """
        if tokens.dim() != 2 or tokens.shape[0] != self.batch_size or tokens.shape[1] < 1:
            raise PyptoCaptureError(
                f"tokens must be [batch_size={self.batch_size}, n >= 1], got {tuple(tokens.shape)}"
            )
        n = int(tokens.shape[1])
        self.reset()
        self.prefill(input_ids, attention_mask)
        if self._host_pos + n - 1 > self.max_cache_len:
            raise PyptoCaptureError(
                f"{n - 1} steps after {self._host_pos} cached tokens exceed "
                f"max_cache_len={self.max_cache_len}"
            )
        self.capture()
        assert self.logits is not None
        out = torch.empty(
            (self.batch_size, n, self.logits.shape[-1]), dtype=self.logits.dtype, device=self.device
        )
        out[:, 0].copy_(self.logits)
        forced = tokens.to(self.device)
        for i in range(1, n):
            self.tok.copy_(forced[:, i - 1 : i])
            if step_times is None:
                self._captured.replay()
            else:
                synchronize(self.device)
                start = time.perf_counter()
                self._captured.replay()
                synchronize(self.device)
                step_times.append(time.perf_counter() - start)
            out[:, i].copy_(self.logits)
        self._host_pos += n - 1
        return out

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int = 16,
    ) -> torch.Tensor:
        """prefill + decode: greedy new tokens [B, max_new_tokens] (no EOS stopping)."""
        self.reset()
        first = self.prefill(input_ids, attention_mask)
        rest = self.decode(first, max_new_tokens - 1)
        return torch.cat([first.unsqueeze(-1), rest], dim=-1)

    def close(self) -> None:
        """Undo mitigations applied by this runner and drop the captured step and cache."""
        if self.mitigations is not None:
            self.mitigations.undo()
            self.mitigations = None
        self._captured = None
        self.cache = None

    def __enter__(self) -> DecodeStepRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """Rewind the cache and position for a new prompt with the same shapes (graph stays valid)."""
        if self.cache is not None:
            self.cache.reset()
        self._host_pos = 0
