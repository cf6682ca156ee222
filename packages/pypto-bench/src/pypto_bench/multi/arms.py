"""One arm measured on this process's model (a rank's shard, the pipeline's stages, or the
whole model alone for the 1-rank baseline) with the single-process protocol of
:mod:`pypto_bench.bench`: the same warmup, iterations and synchronized timed spans.

The one module of :mod:`pypto_bench.multi` that calls the single-process protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._shared import Beat, spread
from .comm import GRAPH_COMM_UNMEASURED_CPU, communication
from .fit import release_memory

if TYPE_CHECKING:
    from ..config import BenchConfig

__all__ = [
    "DISTRIBUTED_AUTO_BACKEND",
    "TP_NUMERICS_BASIS",
    "Judge",
    "Measured",
    "graph_backend_for",
    "make_ctx",
    "measure_arm",
    "measure_arms",
    "measure_baseline",
    "reference_payload",
    "share_reference",
]

#: ``--graph-backend auto`` across ranks: plain stream capture on accelerators (the eager
#: step with its collectives inside); compiling first would also trace the collectives
#: into inductor's graph, one more layer between the bench and the NCCL/HCCL calls.
DISTRIBUTED_AUTO_BACKEND = {"cpu": "compile", "cuda": "cudagraph", "npu": "npugraph"}


class Measured:
    """One protocol run on one rank: the arm, its outputs and the rank's figures."""

    def __init__(self, arm: Any, tokens: Any, output: Any, figures: dict[str, Any]) -> None:
        self.arm = arm
        self.tokens = tokens
        self.output = output
        self.figures = figures
        self.model_info: dict[str, Any] = {}
        self.ctx: Any = None


#: What a sharded run's arms are judged against (the report's ``numerics.against``).
TP_NUMERICS_BASIS = (
    "the 1-rank run's eager logits (the whole model on one device, same dtype), "
    "teacher-forced with its tokens"
)


class Judge:
    """The numerical gate of a sharded run (issue #42): every arm, eager included, against
    the 1-rank run's eager reference, teacher-forced with its tokens, so an error that
    appears "only with TP > 1" (a mis-sharded layer, a wrong reduction) fails the arm as
    a wrong graph arm does in one process.

    Rank 0 holds the reference (``full``); the other ranks get its tokens (``shared``,
    broadcast by the caller) and run the same forwards, which are collective. Without a
    1-rank run (skipped: the whole model does not fit one device) nothing is judged and
    every arm says why.
    """

    def __init__(self, shared: dict[str, Any], full: Any = None) -> None:
        self.shared = shared
        self.full = full

    @classmethod
    def alone(cls, ref: Any, why: str | None) -> Judge:
        """The judge of a run in one process (the pipeline placement): nothing to share."""
        return cls(reference_payload(ref, why), ref)

    def __call__(self, ctx: Any, arm: Any, run: Any) -> None:
        from ..numerics import Reference, arm_logits, judge_arm, precheck

        shared = self.shared
        ref = self.full
        if ref is None and "regime" in shared:  # a rank other than 0: tokens, no logits
            tokens = shared.get("tokens")
            ref = Reference(
                str(shared["regime"]),
                str(shared.get("dtype")),
                None,
                None if tokens is None else tokens.to(ctx.device),
            )
        if not precheck(ctx, arm, ref, shared.get("why")):
            return
        try:
            logits, n, basis = arm_logits(ctx, arm, run, ref, eager=True)
        except Exception as err:  # every rank raises alike: the forwards are the same
            arm.numerics = {"verdict": "not checked", "why": f"{type(err).__name__}: {err}"}
            return
        if self.full is not None:
            judge_arm(arm, logits, n, basis, self.full, against=TP_NUMERICS_BASIS)


def reference_payload(ref: Any, why: str | None) -> dict[str, Any]:
    """What the other ranks need of the 1-rank reference (its regime, dtype and tokens on
    the host), or why there is none (None: a regime the gate does not check)."""
    if ref is None:
        return {"why": why}
    tokens = None if ref.tokens is None else ref.tokens.detach().cpu()
    return {"regime": ref.regime, "dtype": ref.dtype, "tokens": tokens}


def share_reference(ref: Any, why: str | None, rank: int, device: Any) -> dict[str, Any]:
    """Rank 0's :func:`reference_payload` on every rank: one collective broadcast, bounded
    by the process group's timeout like every collective of the run."""
    import torch.distributed as dist

    payload: list[Any] = [reference_payload(ref, why) if rank == 0 else None]
    dist.broadcast_object_list(payload, src=0, device=None if device.type == "cpu" else device)
    return dict(payload[0])


def make_ctx(config: BenchConfig, model: Any, tokenizer: Any, device: Any, tick: Any) -> Any:
    """The single-process protocol's context (prompt, model, device, progress tick)."""
    from ..protocol import make_context

    return make_context(config, model, tokenizer, device, tick)


def measure_arm(
    ctx: Any,
    name: str,
    *,
    with_comm: bool,
    keep_in: Path | None = None,
    judge: Judge | None = None,
) -> Measured:
    """The single-process protocol of ``pypto_bench.bench`` for arm ``name`` on this
    process's model (eager: prefill or generate; graph: the captured decode step), plus,
    with ``with_comm``, the communication of one extra profiled step (kept in ``keep_in``
    where given: :func:`pypto_bench.multi.comm.communication`)."""
    import torch

    from ..protocol import Memory, moe_routing_for
    from ..protocol.decode import eager_generate, run_decode
    from ..protocol.prefill import prefill_fn, run_eager_prefill
    from ..report import ArmResult

    arm = ArmResult(name=name)
    mem = Memory(ctx.device)
    if name == "graph":
        # As in one process: the graph arm's MoE experts run capture-safe (exact by default).
        keep: dict[str, Any] = {}
        with moe_routing_for(ctx, arm):
            tokens = run_decode(ctx, arm, mem, keep)
            arm.memory = mem.result()
            if judge is not None:
                judge(ctx, arm, keep.get("once"))
            # One more replayed iteration under the profiler (a CUDA graph replays NCCL
            # kernels, which CUPTI sees). Not on CPU: profiling the compiled step while two
            # gloo all-reduces are in flight crashed a rank (SIGSEGV in wait_tensor, once in
            # a CI run; torch 2.13), and a measurement must not be able to kill the run.
            if not with_comm:
                comm = None
            elif ctx.device.type == "cpu":
                comm = {
                    "seconds": None, "step_seconds": None, "share": None, "method": None,
                    "unmeasured": GRAPH_COMM_UNMEASURED_CPU,
                }  # fmt: skip
            else:
                comm = communication(keep["once"], ctx.device, keep_in=keep_in)
        return Measured(arm, tokens, tokens.detach().cpu(), _rank_figures(arm, comm))
    if ctx.config.regime == "prefill":
        tokens = run_eager_prefill(ctx, arm, mem)
        step: Callable[[], Any] = prefill_fn(ctx)
    else:
        tokens = run_decode(ctx, arm, mem)

        def step() -> Any:
            return eager_generate(ctx)[0]

    arm.memory = mem.result()
    if judge is not None:
        judge(ctx, arm, step if ctx.config.regime == "prefill" else None)
    with torch.inference_mode():
        out = prefill_fn(ctx)() if ctx.config.regime == "prefill" else tokens
    out = out.full_tensor() if hasattr(out, "full_tensor") else out
    comm = communication(step, ctx.device, keep_in=keep_in) if with_comm else None
    return Measured(arm, tokens, out.detach().float().cpu(), _rank_figures(arm, comm))


def measure_arms(
    ctx: Any,
    names: Sequence[str],
    *,
    with_comm: bool,
    keep_in: Path | None = None,
    judge: Judge | None = None,
) -> tuple[dict[str, Measured], dict[str, Any]]:
    """Every arm of ``names`` on this process's model, in the schedule the config asks for:
    interleaved rounds by default (:func:`pypto_bench.rounds.run_interleaved`; each round
    one collective step per arm, the order the same on every rank), one arm after the other
    with ``--schedule sequential`` or where interleaving is unsafe (the schedule says why).
    A failing arm raises (on a rank: the run fails, as one arm after the other does).
    ``judge``: each arm's numerical verdict, taken while the arm is still built.

    Returns (the arms' measurements, the report's ``schedule``)."""
    from ..config import Schedule
    from ..report import ArmResult
    from ..rounds import Fallback, run_interleaved

    cfg = ctx.config
    why = None
    if cfg.schedule == Schedule.INTERLEAVED and len(names) > 1:
        done: dict[str, Measured] = {}

        def failed(arm: ArmResult, err: BaseException) -> None:
            raise err

        def after(arm: ArmResult, run: Callable[[], Any]) -> None:
            done[arm.name] = _after_rounds(ctx, arm, run, with_comm, keep_in)
            if judge is not None:
                judge(ctx, arm, run)

        try:
            _, schedule = run_interleaved(
                ctx, [ArmResult(name=n) for n in names], failed, after=after
            )
            return {n: done[n] for n in names}, schedule
        except Fallback as err:
            why = f"not interleaved: {err}"
    runs = {
        n: measure_arm(
            ctx, n, with_comm=with_comm, keep_in=keep_in / n if keep_in else None, judge=judge
        )
        for n in names
    }
    order = [[n, i] for n in names for i in range(len(runs[n].figures["samples_s"]))]
    schedule = {
        "kind": Schedule.SEQUENTIAL.value,
        "requested": cfg.schedule,
        "rounds": cfg.iters,
        "order": order,
        **({"why": why} if why else {}),
    }
    return runs, schedule


def _after_rounds(
    ctx: Any, arm: Any, run: Callable[[], Any], with_comm: bool, keep_in: Path | None
) -> Measured:
    """An interleaved arm's outputs (one more iteration, outside the timed rounds) and
    the communication of one more, profiled (as :func:`measure_arm` measures them)."""
    from ..config import Regime

    if ctx.config.regime == Regime.PREFILL:
        out = run()  # the logits
        out = out.full_tensor() if hasattr(out, "full_tensor") else out
        tokens = out.argmax(-1)
        output = out.detach().float().cpu()
    else:
        tokens = run()[0]
        output = tokens.detach().cpu()
    comm: dict[str, Any] | None = None
    if with_comm:
        if arm.name == "graph" and ctx.device.type == "cpu":
            comm = {
                "seconds": None, "step_seconds": None, "share": None, "method": None,
                "unmeasured": GRAPH_COMM_UNMEASURED_CPU,
            }  # fmt: skip
        else:
            comm = communication(run, ctx.device, keep_in=keep_in / arm.name if keep_in else None)
    return Measured(arm, tokens, output, _rank_figures(arm, comm))


def _rank_figures(arm: Any, comm: dict[str, Any] | None) -> dict[str, Any]:
    """What a rank reports for one arm: its timed samples, memory and communication."""
    seconds = list(arm.seconds.get("samples") or [])
    return {
        "step_s": spread(seconds),
        "samples_s": seconds,
        "ttft_s": list((arm.ttft_s or {}).get("samples") or []),
        "tokens_per_iter": list(arm.tokens_per_iter),
        "memory": arm.memory,
        "communication": comm,
    }


def measure_baseline(
    config: BenchConfig, device: Any, beat: Beat
) -> tuple[dict[str, Measured], Any, str | None]:
    """Rank 0 alone, the whole model, the standard load: the 1-rank run of this invocation.

    Returns (its arms, the eager reference the sharded arms are judged against (a
    :class:`pypto_bench.numerics.Reference`, None when there is none), why none)."""
    import torch

    from ..loading import load_model

    torch.manual_seed(config.seed)
    loaded = load_model(config.model_path, device=device, **config.load_options())

    def tick(arm: str, done: int, total: int) -> None:
        beat.advance(f"1-rank baseline: iteration {done}/{total}")

    ctx = make_ctx(config, loaded.model, loaded.tokenizer, device, tick)
    if "graph" in config.arms:  # the backend the ranks use: the same capture on both sides
        ctx.graph_backend = graph_backend_for(config, device)
    run, _ = measure_arms(ctx, config.arms, with_comm=False)
    from ..numerics import eager_reference

    ref, why = None, None  # None and None: a regime the gate does not check (it says so)
    try:
        ref = eager_reference(ctx)
    except Exception as err:  # the gate is said to be missing, never fatal to the run
        why = f"the 1-rank reference pass failed ({type(err).__name__}: {err})"
    del ctx, loaded
    release_memory(device)
    return run, ref, why


def graph_backend_for(config: BenchConfig, device: Any) -> Any:
    """The graph arm's backend on a rank (see ``DISTRIBUTED_AUTO_BACKEND``)."""
    from pypto_capture.backends import make_backend

    name = config.graph_backend
    if name == "auto":
        name = DISTRIBUTED_AUTO_BACKEND[device.type]
    # Freezing folds parameters into graph constants and fails on the process group the
    # traced all-reduce takes (inductor: "cannot assign FakeScriptObject to buffer"); the
    # C++ wrapper cannot pass it to the traced all-gather ("arg type Any is not yet
    # supported by custom_op_wrapper"), so the ranks compile with the Python wrapper
    # rather than fail the C++ one first on every rank.
    return make_backend(
        name, device, compile_mode=config.compile_mode, freezing=False, cpp_wrapper=False
    )
