"""A rank of a ``--nproc N`` run: :func:`rank_main` is what torch's elastic agent runs in
every spawned process (pickled by reference: ``pypto_bench.multi.rank.rank_main``).

A rank ends with its launcher, writes its progress to a heartbeat file the launcher's
watchdog reads, joins the process group, and measures: rank 0 first runs the whole model
alone (the 1-rank baseline) while the others wait; then every rank loads its shard and
runs the single-process protocol with a barrier between iterations, so every sample is one
collective step. Rank 0 gathers every rank's figures and writes ``result.json`` (the
report) and ``outputs.pt`` into the run's folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pypto_common import atomic_write_text, redact
from pypto_common.parent import set_parent_death_signal, watch_parent

from ..errors import EnvironmentMissingError, RankFailedError
from .aggregate import build_report
from .arms import (
    Judge,
    Measured,
    graph_backend_for,
    make_ctx,
    measure_arms,
    measure_baseline,
    share_reference,
)
from .fit import baseline_skip_reason, out_of_memory, release_memory
from .lifecycle import EXIT_ORPHANED, TERMINATED_EXIT, group_load_sampler
from .tensor import load_sharded

if TYPE_CHECKING:
    from ..config import BenchConfig

__all__ = [
    "DEVICE_ID_ENV",
    "LAUNCHER_PID_ENV",
    "RANK_PARENT_POLL_S",
    "Heartbeat",
    "bind_local_device",
    "config_from_json",
    "rank_main",
    "run_rank",
]

log = logging.getLogger(__name__)

#: Seconds between a rank's checks that its launcher is alive (the parent-death signal
#: ends it at once on Linux; this is the portable fallback).
RANK_PARENT_POLL_S = 1.0
#: Environment variable naming the launcher's pid to its ranks (their expected parent).
LAUNCHER_PID_ENV = "PYPTO_BENCH_LAUNCHER_PID"
#: Set in each rank's environment to its local device index before anything can import
#: PyPTO (the reference workflow's multi-NPU runs set it; harmless where unread).
DEVICE_ID_ENV = "TILE_FWK_DEVICE_ID"
#: Seconds between the other ranks' checks that rank 0's baseline is done.
_BASELINE_POLL_S = 0.2


class Heartbeat:
    """The rank's progress file: pid, step counter and stage, read by the watchdog."""

    def __init__(self, folder: Path, rank: int) -> None:
        self.path = folder / f"rank{rank}.json"
        self.rank = rank
        self.step = 0
        self.stage = "starting"
        self.write()

    def write(self) -> None:
        atomic_write_text(
            self.path,
            json.dumps(
                {
                    "rank": self.rank,
                    "pid": os.getpid(),
                    "step": self.step,
                    "stage": self.stage,
                    DEVICE_ID_ENV: os.environ.get(DEVICE_ID_ENV),
                }
            ),
        )

    def advance(self, stage: str) -> None:
        self.step += 1
        self.stage = stage
        self.write()


def config_from_json(data: dict[str, Any]) -> BenchConfig:
    """The run's ``BenchConfig`` from the spec the launching process wrote (unknown keys
    dropped, tuples restored)."""
    from ..config import BenchConfig

    known = {f.name for f in fields(BenchConfig)}
    values = {k: v for k, v in data.items() if k in known}
    values["arms"] = tuple(values.get("arms") or ())
    values["batches"] = tuple(values.get("batches") or ())
    return BenchConfig(**values)


def _rank_ends_with_launcher() -> None:
    """A rank dies with its launcher: SIGKILL as its parent-death signal, and a watching
    thread that kills the launcher's whole group (this rank, its peers, their helpers)
    when the parent changes, where that signal is unavailable."""
    launcher = int(os.environ.get(LAUNCHER_PID_ENV) or 0)
    if launcher <= 0:
        return

    def end_group() -> None:
        with contextlib.suppress(OSError):
            if os.getpgid(0) == launcher:  # the launcher's own group: the run, nothing else
                os.killpg(launcher, signal.SIGKILL)
        os._exit(EXIT_ORPHANED)

    set_parent_death_signal(signal.SIGKILL)
    # Also catches a launcher gone before the call; polled slowly (the fallback only),
    # so the thread costs a timed step nothing measurable.
    watch_parent(launcher, end_group, poll_s=RANK_PARENT_POLL_S)


def bind_local_device(local_rank: int, device: str) -> list[str]:
    """Bind this rank to its local device before torch or PyPTO can initialise one:
    ``TILE_FWK_DEVICE_ID`` (the local device index) and, where ``device`` may be an NPU,
    the allocator's ``PYTORCH_NPU_ALLOC_CONF`` (read once, at device init); the device
    itself is set from the local rank when the rank opens it. Returns the warnings of a
    binding that came too late (PyPTO or the NPU already initialised)."""
    from ..environment import prepare_device_env

    warnings = prepare_device_env(device)
    if "pypto" in sys.modules:
        msg = f"PyPTO was imported before {DEVICE_ID_ENV} was set: it may use device 0"
        log.warning("%s", msg)
        warnings.append(msg)
    os.environ[DEVICE_ID_ENV] = str(local_rank)
    return warnings


def rank_main(spec_path: str) -> None:
    """Entry point of every rank (run by the elastic agent in a spawned process)."""
    _rank_ends_with_launcher()
    spec = json.loads(Path(spec_path).read_text())
    bind_local_device(int(os.environ.get("LOCAL_RANK", "0")), str(spec["device_type"]))
    rank = int(os.environ["RANK"])
    folder = Path(spec["state_dir"])
    beat = Heartbeat(folder, rank)
    try:
        run_rank(spec, rank, beat)
    except BaseException as err:
        text = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
        atomic_write_text(
            folder / f"rank{rank}.error.json",
            json.dumps({"rank": rank, "stage": beat.stage, "error": redact(text)}),
        )
        raise


def _rank_device(spec: dict[str, Any], local_rank: int) -> Any:
    import torch

    kind = spec["device_type"]
    if kind == "cuda":
        torch.cuda.set_device(local_rank)
    elif kind == "npu":
        from ..environment import NPU

        NPU.resolve("torch_npu.distributed")  # importing it registers the hccl backend
        if not NPU.resolve("torch_npu.distributed.is_hccl_available")():
            raise EnvironmentMissingError(
                "torch_npu has no HCCL here: install the torch_npu matching torch and CANN"
            )
        NPU.resolve("torch_npu.npu.set_device")(local_rank)
    return torch.device(kind) if kind == "cpu" else torch.device(kind, local_rank)


@contextlib.contextmanager
def _store_chatter_held() -> Iterator[int]:
    """While torch's store connects, its C++ side writes each retry to fd 2 with a
    hundred lines of C++ frames (a garbage peer printed ~100 lines before the one-line
    error even under ``-q``). fd 2 goes to a temporary file for the call; what it caught is
    replayed only at ``-v`` (INFO), so the line the user reads is ours. Yields a
    duplicate of the real stderr for whoever must still speak meanwhile (the watchdog).
    """
    import tempfile

    sys.stderr.flush()
    real = os.dup(2)
    try:
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                yield real
            finally:
                sys.stderr.flush()
                os.dup2(real, 2)
                if log.isEnabledFor(logging.INFO):
                    held.seek(0)
                    caught = held.read(1 << 20)
                    if caught:
                        os.write(2, caught)
    finally:
        os.close(real)


#: Seconds past ``--rank-timeout`` the rendezvous watchdog waits before it ends the rank
#: (torch's own timeout, when it applies, says it first and better).
_WATCHDOG_GRACE_S = 5.0


def _init_bounded(
    dist: Any, kwargs: dict[str, Any], launch: Any, wait_s: float, state_dir: str
) -> None:
    """``init_process_group`` for a rank the user's launcher started, bounded in time and
    ended by SIGTERM at any point.

    Why: a ``MASTER_ADDR:MASTER_PORT`` that accepts and never answers (a silent server, a
    plain HTTP server, a stopped rank 0) held torch's store handshake forever: no
    ``--rank-timeout``, and a SIGTERM handler written in Python cannot run while the
    interpreter waits inside that C++ call. A watchdog thread ends the process with the
    rendezvous line and exit 48 past the timeout (nothing of this rank has started yet
    but its temporary folder, removed first), and SIGTERM ends it at once
    (:func:`_sigterm_ends_it`).
    """
    import threading

    from ..errors import EXIT
    from .peers import unreachable_error

    done = threading.Event()
    stderr = [2]  # where the watchdog writes: the real stderr, also while fd 2 is held

    def watchdog() -> None:
        if done.wait(wait_s + _WATCHDOG_GRACE_S):
            return
        err = unreachable_error(launch, TimeoutError("the endpoint did not answer"), wait_s)
        os.write(stderr[0], f"pypto-bench: error: {err}\n".encode(errors="replace"))
        shutil.rmtree(state_dir, ignore_errors=True)  # nothing of this rank stays in /tmp
        os._exit(EXIT.RANK_FAILED)

    with _sigterm_ends_it(state_dir), _store_chatter_held() as real:
        stderr[0] = real
        threading.Thread(target=watchdog, name="rendezvous-watchdog", daemon=True).start()
        try:
            dist.init_process_group(**kwargs)
        finally:
            done.set()


@contextlib.contextmanager
def _sigterm_ends_it(state_dir: str | None = None) -> Iterator[None]:
    """Within the block, SIGTERM ends the process at once (exit 143), removing
    ``state_dir`` first.

    Why: the block is one C++ wait (the store handshake, the peers' all-gather) during
    which a SIGTERM handler written in Python cannot run, so the rank sat out the whole
    ``--rank-timeout`` (issue #43, M1). Python's C-level handler still writes the signal
    number to the wakeup fd the moment it arrives; a thread reading that fd removes the
    rank's temporary folder (it was left behind in /tmp, L5) and ends the process. Nothing
    else of the run has started in these blocks: nothing more to clean up.
    """
    import threading

    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or previous is signal.SIG_IGN:
        yield  # signals are the main thread's; an ignored SIGTERM (nohup) stays ignored
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def watch() -> None:
        while True:
            try:
                got = os.read(read_fd, 64)
            except OSError:
                return
            if not got:
                return  # the block ended: the write end was closed
            if int(signal.SIGTERM) in got:
                if state_dir is not None:
                    shutil.rmtree(state_dir, ignore_errors=True)
                os._exit(TERMINATED_EXIT)

    signal.signal(signal.SIGTERM, lambda *_: None)  # the C handler wakes the thread
    old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    watcher = threading.Thread(target=watch, name="sigterm-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        os.close(write_fd)
        watcher.join(timeout=5)
        os.close(read_fd)


def run_rank(spec: dict[str, Any], rank: int, beat: Heartbeat, *, launch: Any = None) -> None:
    """One rank's whole run: join the process group, the baseline turn, the measurement;
    rank 0 writes ``result.json`` into the spec's folder.

    ``launch`` (a :class:`pypto_bench.multi.external.Launch`): started by the user's own
    launcher. Then no watchdog sees the ranks: every wait (the rendezvous, each
    collective, the others' wait for rank 0's baseline) is bounded by ``--rank-timeout``,
    an unreachable rendezvous is named, and the peers are checked against rank 0 first.
    """
    import datetime

    import torch
    import torch.distributed as dist

    config = config_from_json(spec["config"])
    world = int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(int(spec["threads"]))
    device = _rank_device(spec, int(os.environ["LOCAL_RANK"]))
    kwargs: dict[str, Any] = {"backend": spec["backend"]}
    if spec["backend"] == "nccl":
        kwargs["device_id"] = device
    # Collectives wait longer than the watchdog, so a hang is named by the watchdog (which
    # sees every rank) rather than by a peer's collective timeout.
    wait_s = 2 * config.rank_timeout + 30 if launch is None else config.rank_timeout
    kwargs["timeout"] = datetime.timedelta(seconds=wait_s)
    if launch is None:
        with _store_chatter_held():
            dist.init_process_group(**kwargs)
        if "identity" in spec:  # one node of a multi-node run: the peers checked too
            from .peers import Launch, check_peers

            host = str(spec["rdzv_endpoint"]).rpartition(":")[0].strip("[]")
            nodes = Launch("pypto-bench --nnodes", rank, world, 0, host, 0, "--rdzv-endpoint")
            try:
                peers = check_peers(spec["identity"], nodes)
                _share_host(spec, peers, torch)
            except BaseException:
                with contextlib.suppress(Exception):
                    dist.destroy_process_group()
                raise
    else:
        from .peers import check_peers, unreachable_error

        try:
            _init_bounded(dist, kwargs, launch, wait_s, spec["state_dir"])
        except Exception as err:  # the store's connect timeout, refused connections
            raise unreachable_error(launch, err, wait_s) from err
        try:
            try:
                with _sigterm_ends_it(spec["state_dir"]):
                    peers = check_peers(spec["identity"], launch)
            except RuntimeError as err:  # a peer that never answered (gloo's timeout)
                raise RankFailedError(
                    f"rank {rank}: the peers did not all answer the check against rank 0 "
                    f"within {wait_s:g} s ({' '.join(str(err).split())[:120]}): a rank with "
                    "another world size or rendezvous, or one that died; see its own error"
                ) from err
            _share_host(spec, peers, torch)
        except BaseException:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
            raise
    folder = Path(spec["state_dir"])
    try:
        # The noise guard's load window: both measurements (rank 0 holds the sampler).
        load = group_load_sampler(os.getpgid(0)) if rank == 0 else None
        ref, no_ref = None, None
        if (launch is None and "identity" not in spec) or rank == 0:  # one node: files in common
            baseline, skipped, ref, no_ref = _baseline_turn(config, device, rank, beat, folder)
        else:
            baseline, skipped = None, None
        with _waiting(beat, rank != 0 and (launch is not None or "identity" in spec)):
            dist.barrier()
        # The numerical gate's reference tokens, from the 1-rank run to every rank.
        judge = Judge(share_reference(ref, no_ref, rank, device), ref)
        beat.advance("loading the sharded model")
        runs = _measure_rank(config, device, world, beat, spec, judge)
        figures = {name: r.figures for name, r in runs.items()}
        # Each node keeps its own ranks' figures too (multi.launch.write_node_figures).
        atomic_write_text(folder / f"rank{rank}.figures.json", json.dumps(figures, default=str))
        gathered: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(figures, gathered if rank == 0 else None, dst=0)
        if rank == 0:
            assert load is not None
            data = build_report(
                config, spec, device, runs, baseline, gathered, load.stop(), skipped=skipped
            )
            _save_outputs(folder / "outputs.pt", config, runs, baseline)
            atomic_write_text(folder / "result.json", json.dumps(data))
        beat.advance("done")
        dist.barrier()
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _share_host(spec: dict[str, Any], peers: list[dict[str, Any]], torch: Any) -> None:
    """Hosts in the run, and one core's share per rank *on this host* (the compute on the
    CPU, the host work beside an accelerator): each node's launcher counts only its own
    ranks, a user's launcher none, and nodes can share a host."""
    from .preflight import visible_devices

    hosts = [str(p["host"]) for p in peers]
    spec["nodes"] = len(set(hosts))
    here = hosts.count(str(spec["identity"]["host"]))
    spec["threads"] = max(1, visible_devices("cpu") // max(1, here))
    torch.set_num_threads(int(spec["threads"]))


@contextlib.contextmanager
def _waiting(beat: Heartbeat, on: bool) -> Any:
    """While a rank waits in the barrier for rank 0's baseline on another node, its
    heartbeat advances (its node's watchdog sees only its own ranks, all waiting); the
    process group's timeout still bounds the wait."""
    if not on:
        yield
        return
    import threading

    done = threading.Event()

    def tick() -> None:
        while not done.wait(_BASELINE_POLL_S * 25):
            beat.advance("waiting for rank 0's 1-rank baseline")

    thread = threading.Thread(target=tick, name="pypto-bench-baseline-wait", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _baseline_turn(
    config: BenchConfig, device: Any, rank: int, beat: Heartbeat, folder: Path
) -> tuple[dict[str, Measured] | None, str | None, Any, str | None]:
    """Rank 0 runs the 1-rank baseline (unless it is skipped: why) while the others wait
    for its ``baseline.done``; (baseline runs or None, why skipped or None, the eager
    reference or None, why none)."""
    if rank != 0:
        while not (folder / "baseline.done").exists():
            time.sleep(_BASELINE_POLL_S)
        return None, None, None, None
    baseline, ref, no_ref = None, None, None
    beat.advance("1-rank baseline")
    skipped = baseline_skip_reason(config, device)
    if skipped is None:
        try:
            baseline, ref, no_ref = measure_baseline(config, device, beat)
        except Exception as err:
            if not out_of_memory(err):
                raise
            skipped = (
                "the whole model ran out of memory on one device "
                f"({' '.join(str(err).split())[:160]})"
            )
            release_memory(device)
    if skipped:
        log.warning("1-rank baseline skipped: %s", skipped)
        no_ref = f"no 1-rank run to judge the sharded arms against ({skipped})"
    atomic_write_text(folder / "baseline.done", "1")
    return baseline, skipped, ref, no_ref


def _save_outputs(
    path: Path,
    config: BenchConfig,
    runs: dict[str, Measured],
    baseline: dict[str, Measured] | None,
) -> None:
    """Rank 0's outputs of every arm, sharded and 1-rank, for the caller to compare."""
    import torch

    first = config.arms[0]

    def reference(name: str) -> Any:
        return baseline[name].output if baseline is not None else None

    torch.save(
        {
            "baseline": reference(first),
            "distributed": runs[first].output,
            "arms": {
                name: {"baseline": reference(name), "distributed": r.output}
                for name, r in runs.items()
            },
        },
        path,
    )


def _measure_rank(
    config: BenchConfig,
    device: Any,
    world: int,
    beat: Heartbeat,
    spec: dict[str, Any],
    judge: Judge | None = None,
) -> dict[str, Measured]:
    import torch.distributed as dist

    from ..measure import RssPeak

    load_rss = RssPeak()
    model, tokenizer, load_s = load_sharded(config, world, device, str(spec["plan"]), beat)

    def tick(arm: str, done: int, total: int) -> None:
        beat.advance(f"iteration {done}/{total}")
        dist.barrier()  # outside the timed span: every sample is one collective step

    ctx = make_ctx(config, model, tokenizer, device, tick)
    if "graph" in config.arms:
        ctx.graph_backend = graph_backend_for(config, device)
    dist.barrier()
    kept = Path(config.rank_profiles) if config.rank_profiles else None
    # Interleaved rounds by default (the same order on every rank: each round one
    # collective step per arm); rank 0's report says which schedule ran.
    runs, spec["schedule"] = measure_arms(
        ctx, config.arms, with_comm=True, keep_in=kept, judge=judge
    )
    run = runs[config.arms[0]]
    for r in runs.values():
        r.ctx = ctx
    run.figures.update(
        {
            "rank": dist.get_rank(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            # This node's interfaces for the collectives (multi-node runs: multi.network).
            "network": spec.get("network"),
            "device": str(device),
            DEVICE_ID_ENV: os.environ.get(DEVICE_ID_ENV),
            "load_s": load_s,
            "load_rss_peak_bytes": load_rss.result().get("rss_peak_bytes"),
            "local_parameter_bytes": _local_bytes(model),
        }
    )
    from ..report import model_section

    run.model_info = model_section(
        model,
        path=str(config.model_path),
        model_type=getattr(model.config, "model_type", None),
        load_s=load_s,
        load_memory={"peak_allocated": None, "peak_reserved": None, **load_rss.result()},
        parameters=_global_parameters(model),
    )
    for r in runs.values():
        r.model_info = run.model_info
    return runs


def _global_parameters(model: Any) -> int:
    """The whole model's parameter count: a DTensor counts globally, a shard cut by
    :mod:`pypto_bench.multi.tensor` does not (its count from before the cut)."""
    shard = getattr(model, "pypto_tp_shard", None)
    if shard is not None:
        return int(shard.full_parameters)
    return sum(p.numel() for p in model.parameters())


def _local_bytes(model: Any) -> int:
    """Bytes of the parameters this rank holds (its shards, not the global tensors)."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return int(total)
