"""The contract every regime implements, and what every arm runner shares.

:class:`Context` is what an arm runner needs (model, prompt, device, progress);
:class:`Memory` records an arm's peaks; :func:`timed` (from ``measure``: the one timed
span, a device synchronize at both ends); :class:`RegimeProtocol` is the small abstract contract a regime
module (``decode``, ``prefill``, ``diffusion``) fulfils: its timed run of an arm, one
untimed-built iteration of an arm (what pypto-tune profiles), the eager reference tokens
and how many tokens of an output count for the agreement check.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..config import Arm, BenchConfig
from ..errors import BadInputError
from ..measure import RssPeak, timed
from ..report import ArmResult

__all__ = [
    "PROMPT_TEXT",
    "STATIC_MOE_NOTE",
    "Context",
    "Memory",
    "ProgressFn",
    "RegimeProtocol",
    "apply_moe_routing",
    "kernels_for",
    "make_context",
    "make_prompt_ids",
    "mitigation_details",
    "tick",
    "timed",
]

ProgressFn = Callable[[str, int, int], None]

#: What the report says about an arm whose outputs are not the model's on purpose.
STATIC_MOE_NOTE = (
    "--moe-routing static: every token goes to fixed experts (a throughput proxy), so its "
    "tokens are not the model's; no token match is computed"
)

# Prompt text the synthetic inputs are cut from: natural text keeps byte-level and BPE
# tokenizers in their ordinary regime; rows start at different offsets so a batch is
# not B copies of one sequence.
PROMPT_TEXT = (
    "The history of computing is a story of machines that learned to remember, to "
    "calculate and finally to converse. Early engineers wired logic by hand; later "
    "generations wrote compilers, operating systems and networks that span the world. "
    "Today a single accelerator multiplies matrices faster than a room of mainframes, "
    "and the bottleneck is often memory: every generated word reads the model's weights "
    "once more from high-bandwidth memory into the compute units. "
)


@dataclass
class Context:
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


class Memory:
    """Peak memory per arm and reserved-memory growth across measured iterations.

    Accelerators: the allocator's peaks, reset here. CPU has no allocator counters (torch
    reports 0, which reads as a measurement), so there ``peak_allocated`` /
    ``peak_reserved`` are None and the arm's figure is the process's resident-set peak
    (``rss_peak_bytes``, ``measure.RssPeak``), recorded on every device (host memory).

    Phases: :meth:`end_phase` closes one (its peaks kept under ``phases``) and starts the
    next from the memory in use, so an arm's capture or compile (its first call) and its
    timed iterations each have their own peak; the top-level figures are the last phase's.
    """

    def __init__(self, device: Any) -> None:
        from pypto_capture import memory_stats, reset_peak_memory

        self.device = device
        self._stats = memory_stats
        self._reset_peak = reset_peak_memory
        self._host = getattr(device, "type", str(device)) == "cpu"
        reset_peak_memory(device)
        self._rss = RssPeak()
        self.reserved: list[int] = []
        self.phases: dict[str, dict[str, Any]] = {}

    def sample(self) -> None:
        self.reserved.append(int(self._stats(self.device).reserved))

    def _peaks(self) -> dict[str, Any]:
        stats = self._stats(self.device)
        return {
            "peak_allocated": None if self._host else int(stats.peak_allocated),
            "peak_reserved": None if self._host else int(stats.peak_reserved),
            **self._rss.result(),
        }

    def end_phase(self, name: str) -> None:
        """Keep the peaks since the last phase began under ``phases[name]``; start anew."""
        self.phases[name] = self._peaks()
        self._reset_peak(self.device)
        self._rss = RssPeak()

    def result(self) -> dict[str, Any]:
        growth = (self.reserved[-1] - self.reserved[0]) if len(self.reserved) > 1 else 0
        peaks = self._peaks()
        out = {**peaks, "reserved_per_iter": list(self.reserved), "reserved_growth": int(growth)}
        if self.phases:
            out["phases"] = {**self.phases, "timed": dict(peaks)}
        return out


def tick(ctx: Context, arm: str, done: int) -> None:
    """Report ``done`` of the arm's warmup + measured iterations to ``ctx.progress``."""
    if ctx.progress is not None:
        ctx.progress(arm, done, ctx.config.warmup + ctx.config.iters)


def make_prompt_ids(tokenizer: Any, batch: int, seq: int, special_ids: set[int]) -> Any:
    """[batch, seq] token ids without special tokens; rows start at different offsets."""
    import torch

    ids = [
        t
        for t in tokenizer(PROMPT_TEXT, add_special_tokens=False)["input_ids"]
        if t not in special_ids
    ]
    if not ids:
        raise BadInputError("the tokenizer produced no ordinary tokens for the prompt text")
    need = seq + 7 * batch
    while len(ids) < need:
        ids = ids + ids
    rows = [ids[7 * b : 7 * b + seq] for b in range(batch)]
    return torch.tensor(rows, dtype=torch.long)


def make_context(
    config: BenchConfig, model: Any, tokenizer: Any, device: Any, progress: ProgressFn | None
) -> Context:
    """The prompt and everything an arm runner needs, for a loaded model.

    One definition for the single-process bench and each rank of ``--nproc``: every run
    builds its prompt from the same rule (same special-token exclusions, same offsets).
    """
    import torch

    from ..loading import eos_token_ids

    eos = eos_token_ids(model, tokenizer)
    special = set(eos) | {
        t for t in (tokenizer.pad_token_id, tokenizer.bos_token_id) if t is not None
    }
    special |= set(getattr(tokenizer, "all_special_ids", []) or [])
    input_ids = make_prompt_ids(tokenizer, config.batch, config.seq, special).to(device)
    return Context(
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


def mitigation_details(handle: Any, backend: str, device_type: str) -> dict[str, Any]:
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
def kernels_for(ctx: Context, arm_name: str) -> Iterator[list[Any]]:
    """The arm's kernel plug-ins switched on (none but for pypto+graph), as a list."""
    if arm_name != Arm.PYPTO_GRAPH:
        yield []
        return
    from ..plugins import applicable_plugins

    plugins = applicable_plugins(ctx.model)
    with contextlib.ExitStack() as stack:
        for plugin in plugins:
            stack.enter_context(plugin.enable(ctx.model))
        yield plugins


@contextlib.contextmanager
def apply_moe_routing(ctx: Context, arm: ArmResult, token_counts: tuple[int, ...]) -> Iterator[Any]:
    """The graph arms' MoE experts: exact by default, the static proxy on request.

    ``token_counts``: the token counts a capture of this regime sees (the regime's
    :meth:`RegimeProtocol.moe_token_counts`), so the static proxy's tables exist before it.
    The eager arm is the reference and keeps the model's own forward, as does the hf-compile
    arm (the user's alternative runs the model as transformers ships it). A dense model
    comes back with an empty handle and the arm is unchanged.
    """
    if arm.name in (Arm.EAGER, Arm.HF_COMPILE):
        yield None
        return
    from pypto_capture import apply_moe_routing as apply

    cfg = ctx.config
    handle = apply(ctx.model, cfg.moe_routing, token_counts=token_counts)
    try:
        if handle.applied:
            arm.details["moe_routing"] = cfg.moe_routing
            arm.details["moe_layers"] = len(handle.modules)
            if cfg.moe_routing == "static":
                arm.outputs_differ_by_design = STATIC_MOE_NOTE
        yield handle
    finally:
        handle.undo()


class RegimeProtocol(ABC):
    """One regime's measurement: the contract the single run, ``BenchSession`` (pypto-tune),
    the multi-device ranks and the reference-token pass all consume.

    A regime module implements it once, dispatching on the arm inside; nothing outside
    the module names the (regime x arm) pairs. Get one with ``protocol.regime_for``.
    """

    #: The ``--regime`` this protocol measures.
    regime: ClassVar[str]

    @abstractmethod
    def run(self, ctx: Context, arm: ArmResult, mem: Memory) -> Any:
        """Warmup and the timed iterations of ``arm.name``: fills ``arm`` (samples,
        details), samples ``mem`` once per iteration, returns the last iteration's tokens."""

    @abstractmethod
    def iteration(
        self, ctx: Context, arm: ArmResult
    ) -> contextlib.AbstractContextManager[Callable[[], Any]]:
        """A context yielding one measured iteration of ``arm.name`` as a no-argument
        callable, built (compiled, captured) before the yield and torn down after."""

    @abstractmethod
    def reference(self, ctx: Context) -> Any:
        """The eager arm's tokens, for the agreement check when eager was not requested."""

    @abstractmethod
    def produced(self, ctx: Context, tokens: Any) -> list[int]:
        """Per row, how many positions of ``tokens`` the agreement check compares."""

    @abstractmethod
    def moe_token_counts(self, config: BenchConfig) -> tuple[int, ...]:
        """The token counts a captured MoE layer of this regime sees."""
