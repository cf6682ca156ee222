"""``--nproc N``: the bench on N ranks with torch.distributed and transformers' TP plans.

Why this shape:

* Launch is torch's own elastic launcher (``elastic_launch`` / ``LaunchConfig``, what
  ``torchrun`` runs), rendezvous ``c10d`` on 127.0.0.1 with a free port. The launcher runs
  in a child process that leads its own process group, so a failed or hung run is ended
  by killing that group: no rank outlives the run (the agent alone cannot end a rank that
  hangs while alive).
* The model loads sharded by transformers (``from_pretrained(distributed_config=
  DistributedConfig(tp_plan="auto"))``: the family's ``base_model_tp_plan``), not by a
  home-made sharder. A family without a plan is refused before launching.
* Each rank runs the single-process protocol functions of ``pypto_bench.bench`` on its
  shard (same warmup, iterations, synchronized timed spans), with a barrier between
  iterations so every sample is one collective step. Rank 0 first runs the same protocol
  on the whole model alone: the 1-rank baseline of the scaling efficiency and the
  reference the sharded outputs are compared against.
* Progress is a per-rank heartbeat file; the launching process ends the run when no rank
  has made progress for ``rank_timeout`` seconds, naming the rank that hangs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pypto_common import atomic_write_text, redact

from .errors import (
    BadInputError,
    EnvironmentMissingError,
    ModelLoadError,
    NoTensorParallelPlanError,
    RankFailedError,
    TooManyRanksError,
)
from .lifecycle import (
    end_group_members,
    group_stats,
    live_group_members,
    proc_stat,
    set_parent_death_signal,
    sigterm_as_interrupt,
    watch_parent,
)
from .tensor_parallel import check_plan, plan_of, shard_model

if TYPE_CHECKING:
    from .bench import BenchConfig, ProgressFn
    from .report import Report

log = logging.getLogger(__name__)

#: Regimes and arms measured across ranks. The graph arm (decode only): on CPU
#: torch.compile traces the TP collectives into one graph (functional collectives) with
#: inductor's freezing off; on CUDA and NPU the step is stream-captured with its NCCL /
#: HCCL collectives inside (CUDA graphs capture NCCL kernels; torch_npu's NPU graphs
#: capture HCCL tasks), the rank's device graph replayed in lockstep with its peers.
DISTRIBUTED_REGIMES = ("prefill", "decode")
DISTRIBUTED_ARMS = ("eager", "graph")
#: Why the graph arm's time in collectives is not measured on CPU (see ``_protocol``).
GRAPH_COMM_UNMEASURED_CPU = (
    "not measured on CPU: torch.profiler over the compiled step with gloo collectives in "
    "flight can crash a rank (SIGSEGV in wait_tensor); measured on CUDA (NCCL kernels)"
)
#: ``--graph-backend auto`` across ranks: plain stream capture on accelerators (the eager
#: step with its collectives inside); compiling first would also trace the collectives
#: into inductor's graph, one more layer between the bench and the NCCL/HCCL calls.
DISTRIBUTED_AUTO_BACKEND = {"cpu": "compile", "cuda": "cudagraph", "npu": "npugraph"}
#: torch.distributed backend per device type (HCCL is registered by torch_npu).
BACKEND_FOR = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
DEFAULT_RANK_TIMEOUT = 600.0
#: Largest ``--rank-timeout`` accepted (a week): beyond it the collectives' timeout and the
#: rendezvous' overflow, and no step legitimately makes no progress for longer.
MAX_RANK_TIMEOUT = 7 * 24 * 3600.0
#: The launcher's parent-death signal (see ``_launcher_main``): not one torch's elastic
#: agent handles (SIGTERM, SIGINT, SIGHUP, SIGQUIT), so the launcher's own cleanup runs.
ORPHAN_SIGNAL = signal.SIGUSR1
#: Seconds the launcher's watching thread waits for its main thread to clean up after the
#: parent died, before cleaning up itself (a main thread blocked in C never runs handlers).
ORPHAN_GRACE_S = 3.0
#: Seconds between a rank's checks that its launcher is alive (the parent-death signal
#: ends it at once on Linux; this is the portable fallback).
RANK_PARENT_POLL_S = 1.0
#: Environment variable naming the launcher's pid to its ranks (their expected parent).
LAUNCHER_PID_ENV = "PYPTO_BENCH_LAUNCHER_PID"
#: Set in each rank's environment to its local device index before anything can import
#: PyPTO (the reference workflow's multi-NPU runs set it; harmless where unread).
DEVICE_ID_ENV = "TILE_FWK_DEVICE_ID"
#: Profiler events that are collectives called by the rank (c10d and functional c10d ops;
#: the backend's own worker-thread events such as ``gloo:all_reduce`` are not counted).
COLLECTIVE_PREFIXES = ("c10d::", "_c10d_functional::")
#: Max |logit difference| accepted between the sharded and the single-process prefill.
LOGITS_ATOL = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 5e-2}
#: ... or this many machine epsilons of the largest |logit|, whichever is larger. A
#: half-precision run rounds every row-parallel partial sum before the all-reduce, so the
#: sharded logits differ from the 1-rank ones by a few units in the last place of the
#: largest logit; an absolute bound alone fails whenever the logits are large. (The tiny
#: bf16 MiniMax M2.7 folder: logits up to 11.7, bf16 eps 2**-7, sharded vs 1-rank 0.153,
#: while the 1-rank bf16 run itself is 0.120 off the float32 result, the sharded one 0.109:
#: rounding, not a sharding error; its float32 folder agrees to 7e-6.)
LOGITS_EPS_FACTOR = 4.0
_EPS = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}

_POLL_S = 0.2
#: How a spec's ``plan`` names an in-repo family's ``pypto_tp_plan`` (applied by
#: :mod:`pypto_bench.tensor_parallel`; every other plan is transformers').
PYPTO_PLAN_PREFIX = "pypto_tp_plan"


# --- checks before launching -------------------------------------------------------------


def validate_distributed(config: BenchConfig) -> None:
    """Reject what ``--nproc`` cannot run; called by ``BenchConfig.validate`` (no torch)."""
    n = config.nproc
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BadInputError(f"--nproc must be an integer >= 1 (got {n!r})")
    from .pipeline import PLACEMENTS, validate_pipeline

    if config.placement not in PLACEMENTS:
        raise BadInputError(
            f"unknown --placement {config.placement!r}: choose one of {', '.join(PLACEMENTS)}"
        )
    check_rank_timeout(config.rank_timeout)
    if config.placement == "pipeline":
        validate_pipeline(config)
    if n == 1:
        if not config.nproc_baseline:
            raise BadInputError(
                "--no-baseline skips the 1-rank run of --nproc N > 1: drop it, or pass --nproc N"
            )
        return
    if config.regime not in DISTRIBUTED_REGIMES:
        raise BadInputError(
            f"--nproc {n} runs the {' and '.join(DISTRIBUTED_REGIMES)} regimes only, not "
            f"{config.regime}: pass --regime prefill or --nproc 1"
        )
    extra = [a for a in config.arms if a not in DISTRIBUTED_ARMS]
    if extra:
        raise BadInputError(
            f"--nproc {n} measures the eager and graph arms only, got {', '.join(extra)}: "
            "pass --arms eager (or eager,graph with --regime decode)"
        )
    if "graph" in config.arms and config.regime != "decode":
        raise BadInputError(
            f"--nproc {n} measures the graph arm in the decode regime only, not "
            f"{config.regime}: pass --arms eager or --regime decode"
        )
    if len(config.batches) > 1:
        raise BadInputError(f"--nproc {n} takes one --batch, not a sweep: pass a single size")


def check_rank_timeout(value: Any) -> float:
    """``--rank-timeout`` as seconds: a finite number in (0, ``MAX_RANK_TIMEOUT``], else a
    one-line ``BadInputError`` (inf, nan or 1e300 would launch and fail inside the ranks)."""
    fix = f"pass a number of seconds such as --rank-timeout {DEFAULT_RANK_TIMEOUT:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInputError(f"--rank-timeout must be a number of seconds (got {value!r}): {fix}")
    if not math.isfinite(value) or not 0 < value <= MAX_RANK_TIMEOUT:
        raise BadInputError(
            f"--rank-timeout must be finite, > 0 and <= {MAX_RANK_TIMEOUT:g} seconds (a week), "
            f"got {value!r}: {fix}"
        )
    return float(value)


def visible_devices(device_type: str) -> int:
    """How many ranks of this device type fit here: one device per rank.

    CPU: the cores this process may run on (``os.sched_getaffinity``, else
    ``os.cpu_count()``), one core's share per rank.
    """
    if device_type == "cpu":
        try:
            return len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return os.cpu_count() or 1
    if device_type == "cuda":
        import torch

        return int(torch.cuda.device_count())
    if device_type == "npu":
        from .environment import NPU

        return int(NPU.resolve("torch_npu.npu.device_count")())
    raise EnvironmentMissingError(f"no distributed backend for device type {device_type!r}")


def _device_type(config: BenchConfig) -> str:
    from .environment import open_device

    device = open_device(config.device)
    if device.type != "cpu" and (device.index or 0) != 0:
        raise BadInputError(
            f"--device {config.device} with --nproc: rank r uses {device.type}:r, so pass "
            f"--device {device.type} and choose cards with CUDA_VISIBLE_DEVICES / "
            "ASCEND_RT_VISIBLE_DEVICES"
        )
    if device.type not in BACKEND_FOR:
        raise EnvironmentMissingError(f"no distributed backend for device type {device.type!r}")
    return device.type


def check_nproc(config: BenchConfig) -> str:
    """The device type, after refusing more ranks than visible devices (before launching)."""
    device_type = _device_type(config)
    have = visible_devices(device_type)
    if config.nproc > have:
        what = "CPU cores" if device_type == "cpu" else f"{device_type} devices"
        raise TooManyRanksError(
            f"--nproc {config.nproc} needs {config.nproc} {what} (one per rank) but {have} "
            f"are visible here: pass --nproc {have} or fewer"
        )
    return device_type


def check_tp_plan(config: BenchConfig) -> str:
    """Name the plan transformers will use, or refuse a family without one (no launch)."""
    from .loading import check_model_folder, read_model_config

    path = check_model_folder(config.model_path)
    raw = read_model_config(path)
    check_model_code(config, path, raw)
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=config.trust_remote_code
        )
    except Exception as err:
        raise ModelLoadError(
            f"reading {path}/config.json failed: {redact(' '.join(str(err).split()))[:300]}"
        ) from err
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    model_type = getattr(cfg, "model_type", None) or raw.get("model_type")
    own = plan_of(cfg) or plan_of(text)
    if own:  # an in-repo family (a pinned folder): its plan, applied by pypto_bench
        check_plan(own, text, config.nproc)
        _check_heads(text, model_type, config.nproc)
        return f"{PYPTO_PLAN_PREFIX} of {type(cfg).__name__} ({len(own)} rules, in-repo family)"
    plan = getattr(cfg, "base_model_tp_plan", None) or getattr(text, "base_model_tp_plan", None)
    if not plan:
        raise NoTensorParallelPlanError(
            f"model type {model_type!r} has no tensor-parallel plan (its config's "
            f"base_model_tp_plan is empty), so --nproc {config.nproc} cannot shard it: run it "
            "with --nproc 1, or use the fallback for prefill, pipeline placement of its layers "
            "across the devices with an accelerate-style device map: --placement pipeline "
            "--regime prefill --arms eager"
        )
    _check_heads(text, model_type, config.nproc)
    return f"transformers base_model_tp_plan of {type(cfg).__name__} ({len(plan)} rules)"


def check_model_code(config: BenchConfig, path: Path, raw: dict[str, Any]) -> None:
    """Refuse a model whose config needs the folder's own code without
    ``--trust-remote-code`` (``ModelLoadError``, exit 40), before any placement starts."""
    from .loading import needs_remote_code

    if needs_remote_code(raw) and not config.trust_remote_code:
        raise ModelLoadError(
            f"model type {raw.get('model_type')!r} at {path} ships its own code: "
            "rerun with --trust-remote-code if you trust that folder"
        )


def check_tokenizer(config: BenchConfig, path: Path) -> None:
    """Load the folder's tokenizer as every placement will, before any starts: one that
    needs the folder's own code without ``--trust-remote-code`` (its ``auto_map``), or
    fails to load at all, is a ``ModelLoadError`` (exit 40, the single-process load's
    code) now, not a rank failure (48) inside rank 0 after the 1-rank baseline."""
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=config.trust_remote_code
        )
    except Exception as err:  # transformers raises many unrelated types here
        msg = redact(" ".join(str(err).split()))
        if "trust_remote_code" in msg and not config.trust_remote_code:
            raise ModelLoadError(
                f"{path} needs its own code to load (its tokenizer): rerun with "
                "--trust-remote-code if you trust it"
            ) from err
        raise ModelLoadError(
            f"loading the tokenizer of {path} failed: {type(err).__name__}: {msg[:300]}"
        ) from err


def require_accelerate(what: str) -> None:
    """``EnvironmentMissingError`` (exit 3) before anything starts when accelerate, which
    transformers' own placement (a TP plan, a device map) needs, cannot be imported."""
    try:
        import accelerate  # noqa: F401
    except ImportError as err:
        raise EnvironmentMissingError(
            f"{what} needs accelerate, which cannot be imported here "
            f"({type(err).__name__}: {' '.join(str(err).split())[:200]}): "
            "pip install 'pypto-bench[distributed]'"
        ) from err


def _check_heads(text: Any, model_type: Any, nproc: int) -> None:
    for name in ("num_attention_heads", "num_key_value_heads"):
        for heads in _head_counts(text, name):
            if heads % nproc == 0:
                continue
            raise BadInputError(
                f"{name} = {heads} of {model_type!r} is not divisible by --nproc "
                f"{nproc}: tensor parallelism splits heads evenly, pick an --nproc "
                "that divides it"
            )


def _head_counts(text: Any, name: str) -> set[int]:
    """Every value of a head count: one global value, or per layer where the config varies
    it (Gemma 4's configs refuse the global read of a per-layer attribute)."""
    try:
        heads = getattr(text, name, None)
    except Exception:  # a per-layer attribute read globally
        heads = None
    if isinstance(heads, int):
        return {heads}
    layers = getattr(text, "per_layer_config", None) or []
    return {h for c in layers if isinstance(h := getattr(c, name, None), int)}


def free_port() -> int:
    """A free TCP port on loopback for the c10d rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the launching process ---------------------------------------------------------------


def run_distributed(
    config: BenchConfig,
    *,
    progress: ProgressFn | None = None,
    state_dir: str | Path | None = None,
) -> Report:
    """Run ``config`` on ``config.nproc`` ranks; the report holds every rank's figures.

    ``state_dir`` keeps the run's files (per-rank heartbeats with pids, ``result.json``,
    ``outputs.pt`` with rank 0's single-process and sharded outputs, ``launcher.log``);
    default: a temporary folder removed afterwards. Raises like ``run_bench``, plus
    ``TooManyRanksError`` (before launching), ``NoTensorParallelPlanError`` and
    ``RankFailedError`` (a rank failed or hung; every rank has been ended). ``progress``
    is accepted for ``run_bench``'s signature; ranks report through their heartbeats.

    No process of the run outlives the caller (see :mod:`pypto_bench.lifecycle`): SIGTERM
    in the main thread unwinds like Ctrl-C (``Terminated``: every rank ended, the
    temporary folder removed); a caller killed outright is noticed by the launcher, which
    ends every rank and removes the temporary folder before exiting.
    """
    config.validate()
    from .loading import check_model_folder
    from .report import check_report_path

    check_model_folder(config.model_path)
    if config.report_file:
        check_report_path(config.report_file)
    device_type = check_nproc(config)
    plan = check_tp_plan(config)
    if not plan.startswith(PYPTO_PLAN_PREFIX):
        require_accelerate(f"--nproc {config.nproc} with transformers' tensor-parallel plan")
    check_tokenizer(config, check_model_folder(config.model_path))
    with sigterm_as_interrupt(), contextlib.ExitStack() as stack:
        temporary = state_dir is None
        if state_dir is None:
            state_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="pypto-dist-"))
        folder = Path(state_dir)
        folder.mkdir(parents=True, exist_ok=True)
        cores = visible_devices("cpu")
        spec = {
            "config": _config_to_json(config),
            "device_type": device_type,
            "backend": BACKEND_FOR[device_type],
            "port": free_port(),
            "run_id": uuid.uuid4().hex[:12],
            "state_dir": str(folder),
            "threads": max(1, cores // config.nproc),
            "plan": plan,
            "command_line": list(config.command_line or sys.argv),
            # The launcher ends the run when this process ends, removing a temporary folder.
            "parent_pid": os.getpid(),
            "remove_when_orphaned": temporary,
        }
        spec_path = folder / "spec.json"
        atomic_write_text(spec_path, json.dumps(spec))
        log.info(
            "launching %d ranks (%s, %s, rendezvous 127.0.0.1:%d)",
            config.nproc,
            device_type,
            spec["backend"],
            spec["port"],
        )
        _launch_and_wait(spec_path, folder, config)
        data = json.loads((folder / "result.json").read_text())
    report = _report_from_dict(data)
    for warning in report.warnings:
        log.warning("%s", warning)
    if config.report_file:
        report.write(config.report_file)
    return report


def _config_to_json(config: BenchConfig) -> dict[str, Any]:
    return json.loads(json.dumps(asdict(config)))


def _config_from_json(data: dict[str, Any]) -> BenchConfig:
    from .bench import BenchConfig

    known = {f.name for f in fields(BenchConfig)}
    values = {k: v for k, v in data.items() if k in known}
    values["arms"] = tuple(values.get("arms") or ())
    values["batches"] = tuple(values.get("batches") or ())
    return BenchConfig(**values)


def _report_from_dict(data: dict[str, Any]) -> Report:
    from .report import ArmResult, Report

    known = {f.name for f in fields(Report)} - {"written_to"}
    arm_fields = {f.name for f in fields(ArmResult)}
    values = {k: v for k, v in data.items() if k in known}
    values["arms"] = [
        ArmResult(**{k: v for k, v in a.items() if k in arm_fields}) for a in data.get("arms", [])
    ]
    return Report(**values)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the launcher's whole process group (the agent and every rank), then wait
    until no member of it is still running (zombies waiting for their reaper are ended)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


_stat = proc_stat
_group_stats = group_stats
#: Pids of the live processes of a group (re-exported from :mod:`pypto_bench.lifecycle`).
group_members = live_group_members


def _launch_and_wait(spec_path: Path, folder: Path, config: BenchConfig) -> None:
    log_path = folder / "launcher.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pypto_bench.distributed", str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killpg ends every rank
        )
        # The launcher leads the process group of every rank: its pid names that group.
        atomic_write_text(folder / "launcher.pid", str(proc.pid))
        watch = _Watchdog(folder, config.nproc, config.rank_timeout)
        try:
            while proc.poll() is None:
                time.sleep(_POLL_S)
                hung = watch.check()
                if hung:
                    _kill_group(proc)
                    raise RankFailedError(hung)
        except BaseException:
            _kill_group(proc)
            raise
        _kill_group(proc)  # anything a rank left behind (it must not outlive the run)
    if proc.returncode == 0 and (folder / "result.json").is_file():
        return
    failure = folder / "failure.json"
    if failure.is_file():
        raise RankFailedError(json.loads(failure.read_text())["message"])
    tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    last = tail[-1].strip() if tail else "no output"
    raise RankFailedError(
        f"the launcher exited with status {proc.returncode} before any rank reported "
        f"({redact(last)[:300]}); rerun with -v"
    )


class _Watchdog:
    """Ends the run when no rank has advanced its step for ``timeout`` seconds.

    Progress is the step counter of each rank's heartbeat file, not its mtime, so a rank
    waiting for another (rank 0's baseline) does not look alive by writing.
    """

    def __init__(self, folder: Path, nproc: int, timeout: float) -> None:
        self.folder = folder
        self.nproc = nproc
        self.timeout = timeout
        self.last_change = time.monotonic()
        self.steps: dict[int, Any] = {}
        self.cpu: dict[int, float] = {}
        self.busy: set[int] = set()

    def read(self) -> dict[int, dict[str, Any]]:
        states = {}
        for rank in range(self.nproc):
            with contextlib.suppress(OSError, ValueError):
                states[rank] = json.loads((self.folder / f"rank{rank}.json").read_text())
        return states

    def check(self) -> str | None:
        now = time.monotonic()
        states = self.read()
        for rank, st in states.items():
            if self.steps.get(rank) != st.get("step"):
                self.steps[rank] = st.get("step")
                self.last_change = now
            cpu = _cpu_seconds(st.get("pid"))
            if cpu is not None:
                if rank in self.cpu and cpu - self.cpu[rank] > 0.5 * _POLL_S:
                    self.busy.add(rank)
                else:
                    self.busy.discard(rank)
                self.cpu[rank] = cpu
        if now - self.last_change <= self.timeout:
            return None
        return self.describe(states)

    def describe(self, states: dict[int, dict[str, Any]]) -> str:
        missing = [r for r in range(self.nproc) if r not in states]
        stopped = [r for r, st in states.items() if _proc_state(st.get("pid")) == "T"]
        steps = {r: int(st.get("step", 0)) for r, st in states.items()}
        behind = [r for r, s in steps.items() if s == min(steps.values())] if steps else []
        if missing:
            culprits, why = missing, "it never started"
        elif stopped:
            culprits, why = stopped, "its process is stopped"
        elif len(set(steps.values())) > 1:
            culprits, why = behind, "the other ranks are ahead of it"
        elif self.busy:
            culprits, why = sorted(self.busy), "it is busy without finishing its step"
        else:
            culprits, why = sorted(states), "every rank is waiting"
        where = ", ".join(
            f"rank {r} at {states[r].get('stage', '?')!r}" for r in culprits if r in states
        )
        who = ", ".join(str(r) for r in culprits)
        return (
            f"rank {who} hung ({why}): no rank made progress for {self.timeout:g} s"
            f"{' (' + where + ')' if where else ''}; every rank was ended "
            "(raise --rank-timeout if a step legitimately takes longer)"
        )


def _proc_state(pid: Any) -> str | None:
    rest = _stat(pid)
    return rest[0] if rest else None


def _cpu_seconds(pid: Any) -> float | None:
    rest = _stat(pid)
    try:
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK") if rest else None
    except (ValueError, IndexError):
        return None


# --- the launcher (child process, its own process group) ---------------------------------


class _Orphaned:
    """The launcher's end when its parent (the command) is gone: every other process of
    its group killed (ranks, their helpers), the run's temporary folder removed, exit.

    Two triggers, one cleanup: ``ORPHAN_SIGNAL`` (the parent-death signal) runs it on the
    main thread, where nothing of the agent can run beside it; the watching thread sends
    that signal when it sees the parent change, and cleans up itself if the main thread
    has not within ``ORPHAN_GRACE_S`` (a main thread blocked in C runs no handler).
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.lock = threading.Lock()

    def on_signal(self, signum: int, frame: Any) -> None:
        self.end()

    def on_parent_gone(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), ORPHAN_SIGNAL)
        time.sleep(ORPHAN_GRACE_S)
        self.end()

    def end(self) -> None:
        if not self.lock.acquire(blocking=False):
            return  # the other trigger is at it
        try:
            if os.getpgid(0) == os.getpid():  # our own group (never a shell's we joined)
                end_group_members(os.getpid())
            if self.folder is not None:
                for _ in range(5):  # a file written while it was being removed
                    shutil.rmtree(self.folder, ignore_errors=True)
                    if not self.folder.exists():
                        break
        finally:
            os._exit(EXIT_ORPHANED)


#: The launcher's exit status when it ended the run because its parent was gone.
EXIT_ORPHANED = 128 + int(ORPHAN_SIGNAL)


def _watch_parent_of_launcher(spec: dict[str, Any], folder: Path) -> None:
    """Arm both triggers of :class:`_Orphaned` for the command that started us."""
    parent = int(spec.get("parent_pid") or 0)
    if parent <= 0:
        return
    orphaned = _Orphaned(folder if spec.get("remove_when_orphaned") else None)
    signal.signal(ORPHAN_SIGNAL, orphaned.on_signal)
    set_parent_death_signal(ORPHAN_SIGNAL)
    # A parent that died before the call above never sends it: the thread sees it at once.
    watch_parent(parent, orphaned.on_parent_gone)


def _launcher_main(spec_path: str) -> int:
    """Run the elastic agent; on a rank failure write ``failure.json`` naming it."""
    spec = json.loads(Path(spec_path).read_text())
    folder = Path(spec["state_dir"])
    _watch_parent_of_launcher(spec, folder)
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    nproc = int(spec["config"]["nproc"])
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # the ranks' expected parent
    if spec["device_type"] == "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # transformers binds the accelerator
    os.environ["OMP_NUM_THREADS"] = str(spec["threads"])
    launch = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=spec["run_id"],
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{spec['port']}",
        rdzv_configs={"timeout": int(max(60, spec["config"]["rank_timeout"]))},
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        local_addr="127.0.0.1",
        # The agent's per-rank logs stay in the run's folder (removed with it), not in a
        # torchelastic_* folder of its own left in the temporary directory.
        logs_specs=DefaultLogsSpecs(log_dir=str(folder / "elastic")),
    )
    try:
        elastic_launch(launch, _rank_main)(spec_path)
    except ChildFailedError as err:
        message = _failure_message(err, folder)
        atomic_write_text(folder / "failure.json", json.dumps({"message": message}))
        print(message, file=sys.stderr)
        return 1
    return 0


_PEER_WORDS = ("gloo", "nccl", "hccl", "connection", "closed", "peer", "timed out", "timeout")


def _failure_message(err: Any, folder: Path) -> str:
    """One line naming the rank whose failure caused the others' (the root cause)."""
    found = []
    for global_rank, failure in err.failures.items():
        rank = int(global_rank)
        own = folder / f"rank{rank}.error.json"
        cause = None
        with contextlib.suppress(OSError, ValueError):
            cause = json.loads(own.read_text())["error"]
        code = int(failure.exitcode)
        if cause is None and code < 0:
            with contextlib.suppress(ValueError):
                cause = f"killed by {signal.Signals(-code).name}"
        if cause is None:
            cause = f"exit status {code}: {' '.join(str(failure.message).split())[:200]}"
        # A rank that died because a peer vanished reports a communication error:
        # it is a consequence, not the cause.
        consequence = code >= 0 and any(w in cause.lower() for w in _PEER_WORDS)
        found.append((consequence, failure.timestamp, rank, cause))
    found.sort()
    _, _, rank, cause = found[0]
    others = sorted(r for _, _, r, _ in found[1:])
    also = f" (rank {', '.join(map(str, others))} ended after it)" if others else ""
    return redact(f"rank {rank} failed: {cause}{also}; every rank was ended")


# --- a rank ------------------------------------------------------------------------------


class _Heartbeat:
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


def _set_device_env(local_rank: int) -> None:
    """``TILE_FWK_DEVICE_ID``: the rank's local device index, before PyPTO can be imported
    (nothing of the rank imports it before this point: pypto_bench imports it lazily)."""
    if "pypto" in sys.modules:
        log.warning("PyPTO was imported before %s was set: it may use device 0", DEVICE_ID_ENV)
    os.environ[DEVICE_ID_ENV] = str(local_rank)


def _rank_main(spec_path: str) -> None:
    """Entry point of every rank (run by the elastic agent in a spawned process)."""
    _rank_ends_with_launcher()
    _set_device_env(int(os.environ.get("LOCAL_RANK", "0")))
    rank = int(os.environ["RANK"])
    spec = json.loads(Path(spec_path).read_text())
    folder = Path(spec["state_dir"])
    beat = _Heartbeat(folder, rank)
    try:
        _rank_work(spec, rank, beat)
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
        from .environment import NPU

        NPU.resolve("torch_npu.distributed")  # importing it registers the hccl backend
        if not NPU.resolve("torch_npu.distributed.is_hccl_available")():
            raise EnvironmentMissingError(
                "torch_npu has no HCCL here: install the torch_npu matching torch and CANN"
            )
        NPU.resolve("torch_npu.npu.set_device")(local_rank)
    return torch.device(kind) if kind == "cpu" else torch.device(kind, local_rank)


def _rank_work(spec: dict[str, Any], rank: int, beat: _Heartbeat) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    config = _config_from_json(spec["config"])
    world = int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(int(spec["threads"]))
    device = _rank_device(spec, int(os.environ["LOCAL_RANK"]))
    kwargs: dict[str, Any] = {"backend": spec["backend"]}
    if spec["backend"] == "nccl":
        kwargs["device_id"] = device
    # Collectives wait longer than the watchdog, so a hang is named by the watchdog (which
    # sees every rank) rather than by a peer's collective timeout.
    kwargs["timeout"] = datetime.timedelta(seconds=2 * config.rank_timeout + 30)
    dist.init_process_group(**kwargs)
    folder = Path(spec["state_dir"])
    try:
        baseline = None
        # The noise guard's load window: both measurements (rank 0 holds the sampler).
        load = group_load_sampler(os.getpgid(0)) if rank == 0 else None
        skipped: str | None = None
        if rank == 0:
            beat.advance("1-rank baseline")
            skipped = baseline_skip_reason(config, device)
            if skipped is None:
                try:
                    baseline = _baseline(config, device, beat)
                except Exception as err:
                    if not _out_of_memory(err):
                        raise
                    skipped = (
                        "the whole model ran out of memory on one device "
                        f"({' '.join(str(err).split())[:160]})"
                    )
                    _free(device)
            if skipped:
                log.warning("1-rank baseline skipped: %s", skipped)
            atomic_write_text(folder / "baseline.done", "1")
        else:
            while not (folder / "baseline.done").exists():
                time.sleep(_POLL_S)
        dist.barrier()
        beat.advance("loading the sharded model")
        runs = _measure_rank(config, device, world, beat, spec)
        figures = {name: r.figures for name, r in runs.items()}
        gathered: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(figures, gathered if rank == 0 else None, dst=0)
        if rank == 0:
            assert load is not None
            data = _build_report(
                config, spec, device, runs, baseline, gathered, load.stop(), skipped=skipped
            )
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
                folder / "outputs.pt",
            )
            atomic_write_text(folder / "result.json", json.dumps(data))
        beat.advance("done")
        dist.barrier()
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


class _Measured:
    """One protocol run on one rank: the arm, its outputs and the rank's figures."""

    def __init__(self, arm: Any, tokens: Any, output: Any, figures: dict[str, Any]) -> None:
        self.arm = arm
        self.tokens = tokens
        self.output = output
        self.figures = figures
        self.model_info: dict[str, Any] = {}
        self.ctx: Any = None


def _make_ctx(config: BenchConfig, model: Any, tokenizer: Any, device: Any, tick: Any) -> Any:
    from .bench import make_context

    return make_context(config, model, tokenizer, device, tick)


def _protocol(ctx: Any, name: str, *, with_comm: bool) -> _Measured:
    """The single-process protocol of ``pypto_bench.bench`` for arm ``name`` on this
    rank's model (eager: prefill or generate; graph: the captured decode step)."""
    import torch

    from .bench import (
        _eager_generate,
        _Memory,
        _moe_routing_for,
        _prefill_fn,
        _run_eager_decode,
        _run_eager_prefill,
        _run_graph_decode,
    )
    from .report import ArmResult

    arm = ArmResult(name=name)
    mem = _Memory(ctx.device)
    if name == "graph":
        # As in one process: the graph arm's MoE experts run capture-safe (exact by default).
        keep: dict[str, Any] = {}
        with _moe_routing_for(ctx, arm):
            tokens = _run_graph_decode(ctx, arm, mem, keep)
            arm.memory = mem.result()
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
                comm = _communication(keep["once"], ctx.device)
        return _Measured(arm, tokens, tokens.detach().cpu(), _rank_figures(arm, comm))
    if ctx.config.regime == "prefill":
        tokens = _run_eager_prefill(ctx, arm, mem)
        step: Callable[[], Any] = _prefill_fn(ctx)
    else:
        tokens = _run_eager_decode(ctx, arm, mem)

        def step() -> Any:
            return _eager_generate(ctx)[0]

    arm.memory = mem.result()
    with torch.inference_mode():
        out = _prefill_fn(ctx)() if ctx.config.regime == "prefill" else tokens
    out = out.full_tensor() if hasattr(out, "full_tensor") else out
    comm = _communication(step, ctx.device) if with_comm else None
    return _Measured(arm, tokens, out.detach().float().cpu(), _rank_figures(arm, comm))


def _rank_figures(arm: Any, comm: dict[str, Any] | None) -> dict[str, Any]:
    """What a rank reports for one arm: its timed samples, memory and communication."""
    seconds = list(arm.seconds.get("samples") or [])
    return {
        "step_s": _spread(seconds),
        "samples_s": seconds,
        "ttft_s": list((arm.ttft_s or {}).get("samples") or []),
        "tokens_per_iter": list(arm.tokens_per_iter),
        "memory": arm.memory,
        "communication": comm,
    }


def _spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"min": None, "median": None, "max": None}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _baseline(config: BenchConfig, device: Any, beat: _Heartbeat) -> dict[str, _Measured]:
    """Rank 0 alone, the whole model, the standard load: the 1-rank run of this invocation."""
    import torch

    from .loading import load_model

    torch.manual_seed(config.seed)
    loaded = load_model(config.model_path, device=device, **config.load_options())

    def tick(arm: str, done: int, total: int) -> None:
        beat.advance(f"1-rank baseline: iteration {done}/{total}")

    ctx = _make_ctx(config, loaded.model, loaded.tokenizer, device, tick)
    if "graph" in config.arms:  # the backend the ranks use: the same capture on both sides
        ctx.graph_backend = _rank_graph_backend(config, device)
    run = {name: _protocol(ctx, name, with_comm=False) for name in config.arms}
    del ctx, loaded
    _free(device)
    return run


def _free(device: Any) -> None:
    import gc

    gc.collect()
    if device.type != "cpu":
        from pypto_capture.device import empty_cache

        empty_cache(device)


#: The 1-rank baseline runs when weights x this fit the device's free memory (the rest:
#: activations, the KV cache, the allocator's slack).
BASELINE_HEADROOM = 1.2
_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def baseline_skip_reason(config: BenchConfig, device: Any) -> str | None:
    """Why the 1-rank baseline is not run (None: run it): ``--no-baseline``, or a model
    whose weights (at the run's dtype) x ``BASELINE_HEADROOM`` exceed one device's free
    memory. Unknown sizes run it (an out-of-memory error then skips it)."""
    if not config.nproc_baseline:
        return "skipped by --no-baseline"
    from .loading import check_model_folder

    need = checkpoint_bytes(check_model_folder(config.model_path), config.dtype)
    return fit_reason(need, free_bytes(device), device.type, config.dtype)


def fit_reason(need: int | None, free: int | None, device_type: str, dtype: str) -> str | None:
    """The rule of ``baseline_skip_reason``: None (run it) unless both sizes are known and
    the weights x ``BASELINE_HEADROOM`` exceed the free memory."""
    if need is None or free is None or need * BASELINE_HEADROOM <= free:
        return None
    return (
        f"the whole model does not fit one {device_type} device: {need / 2**30:.2f} GiB of "
        f"weights at {dtype} x {BASELINE_HEADROOM} > {free / 2**30:.2f} GiB free"
    )


def checkpoint_bytes(folder: Path, dtype: str) -> int | None:
    """Bytes of the folder's safetensors weights once loaded at ``dtype`` (floating tensors
    converted, others as stored), from the shard headers; None when unknown.

    The shards are exactly the ones the project's strict checkpoint reader
    (``pypto_common.checkpoint``) reads for the loaders: those ``model.safetensors.index.json``
    names (a stray file beside them is not counted), as regular files inside the folder or
    through the links a pypto-patch overlay records (``pypto_patch.overlay_links``: a pinned
    overlay's weights are links into the downloaded folder), never through any other link.
    A folder whose weights cannot be read that way (an indexed shard missing, unreadable
    or malformed, a link nobody recorded) has an unknown size, said in one warning line:
    the baseline then runs, and loading reports the problem itself.
    """
    from pypto_common.checkpoint import CheckpointError, read_checkpoint
    from pypto_patch import PatchError, overlay_links

    try:
        checkpoint = read_checkpoint(folder, links=overlay_links(folder))
    except (CheckpointError, PatchError, OSError) as err:
        log.warning("size of the weights unknown (the 1-rank baseline is not skipped): %s", err)
        return None
    want = _ELEMENT_BYTES.get(dtype)
    total = 0
    for entry in checkpoint.tensors.values():
        floating = entry.dtype.startswith(("F", "BF"))
        total += entry.numel * want if want and floating else entry.nbytes
    return total


def free_bytes(device: Any) -> int | None:
    """Free memory of ``device``: MemAvailable on a CPU, the allocator's query elsewhere."""
    try:
        if device.type == "cpu":
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
            return None
        if device.type == "cuda":
            import torch

            return int(torch.cuda.mem_get_info(device)[0])
        if device.type == "npu":
            from .environment import NPU

            return int(NPU.resolve("torch_npu.npu.mem_get_info")(device)[0])
    except Exception:
        return None
    return None


def _out_of_memory(err: BaseException) -> bool:
    """An allocator's out-of-memory error (CUDA/NPU/CPU), possibly wrapped by the loader."""
    seen: BaseException | None = err
    while seen is not None:
        if type(seen).__name__ == "OutOfMemoryError" or "out of memory" in str(seen).lower():
            return True
        seen = seen.__cause__
    return False


def _load_own_plan(
    config: BenchConfig, world: int, device: Any, beat: _Heartbeat | None = None
) -> tuple[Any, Any, float]:
    """An in-repo family: the standard (strict) load on the host, cut to this rank's shard
    by the family's ``pypto_tp_plan``, then moved to the rank's device.

    Ranks take turns (rank r loads after rank r-1 has dropped what is not its shard), so
    the host holds one whole copy at a time, not one per rank. Every finished turn is
    progress for the watchdog: ``--rank-timeout`` bounds one rank's load, not all N.
    """
    import torch.distributed as dist

    from .loading import load_model

    rank = dist.get_rank()
    start = time.perf_counter()
    model = tokenizer = None
    for turn in range(world):
        if turn == rank:
            loaded = load_model(config.model_path, device="cpu", **config.load_options())
            model, tokenizer = loaded.model, loaded.tokenizer
            plan = plan_of(model.config) or plan_of(model.config.get_text_config())
            if not plan:
                raise ModelLoadError(
                    f"{type(model).__name__} loaded from {config.model_path} carries no "
                    "pypto_tp_plan although its config class declares one: rerun with -v"
                )
            done = shard_model(model, plan, rank=rank, world=world)
            model.pypto_tp_shard = done  # the report's global parameter count and rules
            log.info(
                "rank %d: %d tensors/modules sharded, %d collective hooks",
                rank,
                len(done.sharded),
                done.hooks,
            )
            model.to(device)
            del loaded
        dist.barrier()
        if beat is not None:
            beat.advance(f"loading the sharded model: rank {turn} of {world} loaded")
    return model, tokenizer, time.perf_counter() - start


def _load_sharded(
    config: BenchConfig, world: int, device: Any, plan: str = "", beat: _Heartbeat | None = None
) -> tuple[Any, Any, float]:
    if plan.startswith(PYPTO_PLAN_PREFIX):
        return _load_own_plan(config, world, device, beat)
    from transformers.distributed.configuration_utils import DistributedConfig

    from .loading import check_model_folder, read_model_config

    path = check_model_folder(config.model_path)
    extra = {"distributed_config": DistributedConfig(tp_plan="auto", tp_size=world)}
    return load_placed(config, path, read_model_config(path), extra, f"sharded over {world} ranks")


def load_placed(
    config: BenchConfig, path: Path, raw: dict[str, Any], extra: dict[str, Any], how: str
) -> tuple[Any, Any, float]:
    """Tokenizer and model through transformers' own placement (``extra``: a
    ``distributed_config`` or a ``device_map``, both of which need accelerate), in eval
    mode; (model, tokenizer, seconds). ``how`` names the placement in errors."""
    import torch
    from transformers import AutoTokenizer

    from .loading import _auto_class, ready_for_inference, torch_dtype

    kwargs: dict[str, Any] = {
        "local_files_only": True,
        "trust_remote_code": config.trust_remote_code,
        "dtype": torch_dtype(config.dtype),
        **extra,
    }
    if config.attn_implementation:
        kwargs["attn_implementation"] = config.attn_implementation
    torch.manual_seed(config.seed)
    start = time.perf_counter()
    need = f"loading {how} needs accelerate: pip install 'pypto-bench[distributed]'"
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=config.trust_remote_code
        )
        model = _auto_class(raw).from_pretrained(str(path), **kwargs)
    except ImportError as err:
        raise EnvironmentMissingError(f"{need} ({err})") from err
    except Exception as err:
        msg = redact(" ".join(str(err).split()))
        if "requires `accelerate`" in msg:
            raise EnvironmentMissingError(need) from err
        raise ModelLoadError(
            f"loading {path} {how} failed: {type(err).__name__}: {msg[:300]}"
        ) from err
    ready_for_inference(model, tokenizer)
    return model, tokenizer, time.perf_counter() - start


def _measure_rank(
    config: BenchConfig, device: Any, world: int, beat: _Heartbeat, spec: dict[str, Any]
) -> dict[str, _Measured]:
    import torch.distributed as dist

    from .measure import RssPeak

    load_rss = RssPeak()
    model, tokenizer, load_s = _load_sharded(config, world, device, str(spec["plan"]), beat)

    def tick(arm: str, done: int, total: int) -> None:
        beat.advance(f"iteration {done}/{total}")
        dist.barrier()  # outside the timed span: every sample is one collective step

    ctx = _make_ctx(config, model, tokenizer, device, tick)
    if "graph" in config.arms:
        ctx.graph_backend = _rank_graph_backend(config, device)
    dist.barrier()
    runs = {name: _protocol(ctx, name, with_comm=True) for name in config.arms}
    run = runs[config.arms[0]]
    for r in runs.values():
        r.ctx = ctx
    run.figures.update(
        {
            "rank": dist.get_rank(),
            "pid": os.getpid(),
            "device": str(device),
            DEVICE_ID_ENV: os.environ.get(DEVICE_ID_ENV),
            "load_s": load_s,
            "load_rss_peak_bytes": load_rss.result().get("rss_peak_bytes"),
            "local_parameter_bytes": _local_bytes(model),
        }
    )
    run.model_info = {
        "path": str(config.model_path),
        "class": type(model).__name__,
        "model_type": getattr(model.config, "model_type", None),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "parameters": _global_parameters(model),
        "load_s": load_s,
        "load_memory": {"peak_allocated": None, "peak_reserved": None, **load_rss.result()},
    }
    for r in runs.values():
        r.model_info = run.model_info
    return runs


def _rank_graph_backend(config: BenchConfig, device: Any) -> Any:
    """The graph arm's backend on a rank (see ``DISTRIBUTED_AUTO_BACKEND``)."""
    from pypto_capture.backends import make_backend

    name = config.graph_backend
    if name == "auto":
        name = DISTRIBUTED_AUTO_BACKEND[device.type]
    # Freezing folds parameters into graph constants and fails on the process group the
    # traced all-reduce takes (inductor: "cannot assign FakeScriptObject to buffer").
    return make_backend(name, device, compile_mode=config.compile_mode, freezing=False)


def _global_parameters(model: Any) -> int:
    """The whole model's parameter count: a DTensor counts globally, a shard cut by
    :mod:`pypto_bench.tensor_parallel` does not (its count from before the cut)."""
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


def _communication(step: Callable[[], Any], device: Any) -> dict[str, Any]:
    """Time inside collectives during one extra profiled step (never a timed one).

    CPU (gloo): the union of the rank's c10d / functional-c10d op intervals, i.e. the time
    the rank's thread spent inside collective calls. CUDA: the union of NCCL kernels on
    the device. Share = that time / the profiled step's wall time (profiler overhead
    included in both).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    from pypto_capture import synchronize

    if device.type == "npu":
        return _communication_npu(step, device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with torch.inference_mode(), profile(activities=activities) as prof:
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        wall = time.perf_counter() - start
    spans = []
    by_op: dict[str, float] = {}
    for e in prof.events():
        name = str(e.name)
        if device.type == "cuda":
            on_device = "cuda" in str(getattr(e, "device_type", "")).lower()
            hit = on_device and "nccl" in name.lower()
        else:
            hit = name.startswith(COLLECTIVE_PREFIXES)
        if hit:
            a, b = float(e.time_range.start), float(e.time_range.end)
            spans.append((a, b))
            by_op[name] = by_op.get(name, 0.0) + (b - a) / 1e6
    figures = _comm_figures(
        spans,
        wall,
        "torch.profiler: NCCL kernels on the device (union)"
        if device.type == "cuda"
        else "torch.profiler: c10d / _c10d_functional ops on the rank (union)",
    )
    # Per op name (seconds, summed; spans may nest): where the time went, e.g. a
    # functional all-reduce vs the wait_tensor that blocks until the peers arrive.
    figures["by_op_s"] = dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:8])
    return figures


def _comm_figures(spans: list[tuple[float, float]], wall: float, method: str) -> dict[str, Any]:
    """Time in collectives (the union of their spans, in us) against the step's wall time."""
    busy_us, calls = _union(spans)
    seconds = busy_us / 1e6
    return {
        "seconds": seconds,
        "step_seconds": wall,
        "share": seconds / wall if wall > 0 else None,
        "collective_spans": calls,
        "method": method,
    }


#: torch_npu.profiler's trace_view.json: HCCL operators are spans named ``hcom_<op>_...``
#: on the communication rows (process named "HCCL" / "Communication").
_HCCL_PROCESSES = ("hccl", "communication")
#: Largest trace_view.json read back (one decode or prefill step is a few MB).
_MAX_TRACE_BYTES = 256 * 1024 * 1024


def _communication_npu(step: Callable[[], Any], device: Any) -> dict[str, Any]:
    """HCCL time of one profiled step with torch_npu.profiler (it has no in-memory events:
    it writes an ``*_ascend_pt`` folder, whose trace_view.json is read back here)."""
    import torch

    from pypto_capture import synchronize

    from .environment import NPU

    with tempfile.TemporaryDirectory(prefix="pypto-hccl-") as out:
        handler = NPU.resolve("torch_npu.profiler.tensorboard_trace_handler")(dir_name=out)
        activity = "torch_npu.profiler.ProfilerActivity."
        prof = NPU.resolve("torch_npu.profiler.profile")(
            activities=[NPU.resolve(activity + "CPU"), NPU.resolve(activity + "NPU")],
            on_trace_ready=handler,
        )
        with torch.inference_mode(), prof:
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            wall = time.perf_counter() - start
        traces = sorted(Path(out).glob("*_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json"))
        if not traces:
            return {
                "seconds": None, "step_seconds": wall, "share": None, "method": None,
                "unmeasured": "torch_npu.profiler wrote no trace_view.json (see ~/ascend/log)",
            }  # fmt: skip
        spans = hccl_spans(traces[-1])
    return _comm_figures(
        spans,
        wall,
        "torch_npu.profiler: hcom_* operators on the HCCL rows of trace_view.json (union)",
    )


def hccl_spans(trace_view: Path) -> list[tuple[float, float]]:
    """(start, end) in us of every HCCL operator span of a torch_npu trace_view.json.

    The file is the profiler's output on this machine, still read defensively: size
    bounded, non-numeric fields skipped, no recursion into its values.
    """
    if trace_view.stat().st_size > _MAX_TRACE_BYTES:
        raise ValueError(f"{trace_view} is over {_MAX_TRACE_BYTES >> 20} MiB")
    data = json.loads(trace_view.read_text(encoding="utf-8", errors="replace"))
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(events, list):
        return []
    rows = {
        e.get("pid")
        for e in events
        if isinstance(e, dict)
        and e.get("ph") == "M"
        and e.get("name") == "process_name"
        and isinstance(e.get("args"), dict)
        and any(k in str(e["args"].get("name", "")).lower() for k in _HCCL_PROCESSES)
    }
    spans = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or e.get("pid") not in rows:
            continue
        if not str(e.get("name", "")).lower().startswith("hcom"):
            continue
        try:
            start, dur = float(e["ts"]), float(e["dur"])
        except (KeyError, TypeError, ValueError):
            continue
        spans.append((start, start + dur))
    return spans


def _union(spans: list[tuple[float, float]]) -> tuple[float, int]:
    total = 0.0
    count = 0
    end = float("-inf")
    for a, b in sorted(spans):
        if a >= end:
            total += b - a
            count += 1
            end = b
        elif b > end:
            total += b - end
            end = b
    return total, count


def _build_report(
    config: BenchConfig,
    spec: dict[str, Any],
    device: Any,
    runs: dict[str, _Measured],
    baselines: dict[str, _Measured] | None,
    gathered: list[dict[str, Any]],
    load: dict[str, Any] | None = None,
    *,
    skipped: str | None = None,
) -> dict[str, Any]:
    """Rank 0: per arm the aggregate figures, baseline, scaling and agreement; every rank's
    figures; the noise guard's verdict on the aggregate arms and the 1-rank baselines.

    The first arm's figures stay at the top of ``distributed`` (and of each rank's entry);
    ``distributed["arms"]`` holds every arm's."""
    from dataclasses import replace

    from pypto_capture import device_name

    from .report import new_report

    report = new_report(
        replace(config, command_line=spec["command_line"]),
        device=device,
        device_name=device_name(device),
    )
    first = config.arms[0]
    report.model = runs[first].model_info
    per_arm: dict[str, dict[str, Any]] = {}
    for name in config.arms:
        ranks = [g[name] for g in gathered]
        base = baselines[name] if baselines is not None else None
        arm, figures = _aggregate_arm(config, name, runs[name], base, ranks, skipped)
        per_arm[name] = figures
        add_arm(report, arm, figures, f"{name} on {config.nproc} ranks")
    if skipped:
        report.warnings.append(f"1-rank baseline skipped ({skipped}): {NO_BASELINE_FIGURES}")
    _guard_noise(report, [baselines[n].arm for n in config.arms] if baselines else [], load)
    ranks_out = []
    for g in gathered:
        entry = dict(g[first])
        entry["arms"] = {n: g[n] for n in config.arms if n != first}
        ranks_out.append(entry)
    report.distributed = {
        "nproc": config.nproc,
        "placement": "tensor",
        "device_type": spec["device_type"],
        "backend": spec["backend"],
        "threads_per_rank": spec["threads"],
        "launcher": "torch.distributed.launcher.api.elastic_launch (c10d rendezvous on 127.0.0.1)",
        "tp_plan": spec["plan"],
        **per_arm[first],
        "ranks": sorted(ranks_out, key=lambda r: r["rank"]),
        "arms": per_arm,
    }
    report.finish()
    return report.to_dict()


NO_BASELINE_FIGURES = "no speedup, scaling efficiency or agreement figures"


def add_arm(report: Any, arm: Any, figures: dict[str, Any], where: str) -> None:
    """Append an aggregated arm; a disagreement with the 1-rank run is a warning on both."""
    report.arms.append(arm)
    if figures["agreement"]["ok"] is False:
        msg = f"{where}: {figures['agreement']['summary']}"
        arm.warnings.append(msg)
        report.warnings.append(msg)


def _aggregate_arm(
    config: BenchConfig,
    name: str,
    run: _Measured,
    baseline: _Measured | None,
    ranks: list[dict[str, Any]],
    skipped: str | None = None,
) -> tuple[Any, dict[str, Any]]:
    """One arm across ranks: a collective step ends when its slowest rank does."""
    from .measure import count_tokens, match_rate, summarize, summarize_seconds
    from .report import ArmResult

    n_iter = len(run.figures["samples_s"])
    step = [max(r["samples_s"][i] for r in ranks) for i in range(n_iter)]
    tokens = run.figures["tokens_per_iter"]
    arm = ArmResult(name=name)
    arm.seconds = summarize_seconds(step)
    arm.tokens_per_s = summarize(
        [t / s if s > 0 else 0.0 for t, s in zip(tokens, step, strict=True)]
    )
    arm.tokens_per_iter = list(tokens)
    arm.memory = run.arm.memory
    arm.details = dict(run.arm.details)
    arm.details["ranks"] = config.nproc
    if config.regime == "decode":
        arm.ttft_s = summarize_seconds(
            [max(r["ttft_s"][i] for r in ranks) for i in range(len(run.figures["ttft_s"]))]
        )
    if baseline is None:
        agreement: dict[str, Any] = {
            "ok": None,
            "compared": None,
            "summary": f"not compared: {skipped or 'no 1-rank run'}",
        }
        return arm, {
            "aggregate_tokens_per_s": arm.tokens_per_s,
            "step_s": _spread(step),
            "communication_share": _spread(_shares(ranks)),
            "baseline": None,
            "baseline_skipped": skipped or "no 1-rank run",
            "speedup": None,
            "scaling_efficiency": None,
            "agreement": agreement,
            **_capture_figures(name, arm),
        }
    agreement = _agreement(config, run, baseline, count_tokens, match_rate)
    arm.token_match = agreement.get("token_match")
    base_best = baseline.arm.tokens_per_s.get("best")
    best = arm.tokens_per_s.get("best")
    speedup = best / base_best if best and base_best else None
    figures: dict[str, Any] = {
        "aggregate_tokens_per_s": arm.tokens_per_s,
        "step_s": _spread(step),
        "communication_share": _spread(_shares(ranks)),
        "baseline": {
            "nproc": 1,
            "device": str(run.model_info.get("device") or ranks[0].get("device")),
            "tokens_per_s": baseline.arm.tokens_per_s,
            "seconds": baseline.arm.seconds,
            "memory": baseline.arm.memory,
        },
        "speedup": speedup,
        "scaling_efficiency": speedup / config.nproc if speedup is not None else None,
        "agreement": agreement,
        **_capture_figures(name, arm),
    }
    return arm, figures


def _shares(ranks: list[dict[str, Any]]) -> list[float]:
    return [
        float((r.get("communication") or {})["share"])
        for r in ranks
        if (r.get("communication") or {}).get("share") is not None
    ]


def _capture_figures(name: str, arm: Any) -> dict[str, Any]:
    if name != "graph":
        return {}
    capture = {k: arm.details.get(k) for k in ("backend", "capture_s") if k in arm.details}
    if str(capture.get("backend", "")).startswith(("compile", "fused")):
        capture["freezing"] = False
    return {"capture": capture}


def _guard_noise(report: Report, baselines: list[Any], load: dict[str, Any] | None) -> None:
    """pypto_bench.noise on a multi-rank run: the spread of each collective step (the
    aggregate arms) and of the 1-rank baselines, and the machine load over both runs.
    A noisy baseline makes that arm's scaling efficiency untrustworthy: said per arm."""
    from . import noise

    checks = noise.assess(report.arms, load)
    checks += noise.assess(baselines, None, where="1-rank baseline / ")
    report.noise = noise.noise_section(checks, load)
    for base in baselines:
        if base.unreliable:
            why = f"1-rank {base.name} baseline: {base.unreliable['why']}"
            for arm in report.arms:
                if arm.name == base.name:
                    arm.details["scaling_unreliable"] = why
    line = noise.summary(report.noise)
    if line:
        report.warnings.append(line)


GROUP_METHOD = (
    "/proc/stat busy jiffies minus those of the run's process group (every rank, "
    "the launcher; utime+stime+cutime+cstime), over all cores' jiffies"
)


def group_load_sampler(pgid: int) -> Any:
    """``noise.LoadSampler`` for a run spread over processes: this run's own work is every
    process of the launcher's process group (each rank, the agent, their compile workers),
    so two ranks sharing the cores are not each other's "other load"."""
    from .noise import LoadSampler

    return LoadSampler(lambda: group_jiffies(pgid), GROUP_METHOD)


def group_jiffies(pgid: int) -> int:
    """CPU jiffies (own and reaped children's) of the live processes of group ``pgid``."""
    total = 0
    for _, rest in _group_stats(pgid):
        with contextlib.suppress(ValueError):
            total += sum(int(x) for x in rest[11:15])
    return total


def _agreement(
    config: BenchConfig, run: _Measured, baseline: _Measured, count_tokens: Any, match_rate: Any
) -> dict[str, Any]:
    ref, got = baseline.output, run.output
    if config.regime == "prefill":
        dtype = str(run.model_info.get("dtype"))
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        atol = max(LOGITS_ATOL.get(dtype, 5e-2), LOGITS_EPS_FACTOR * _EPS.get(dtype, 0.0) * scale)
        diff = float((ref - got).abs().max()) if ref.shape == got.shape else float("inf")
        ok = diff <= atol
        n = [ref.shape[1]] * ref.shape[0]
        match = match_rate(ref.argmax(-1), got.argmax(-1), n, n)
        return {
            "compared": "prefill logits vs the 1-rank run",
            "max_abs_diff": diff,
            "atol": atol,
            "atol_rule": (
                f"max({LOGITS_ATOL.get(dtype, 5e-2):g}, {LOGITS_EPS_FACTOR:g} x {dtype} eps x "
                f"max |logit| {scale:.3g})"
            ),
            "ok": ok,
            "token_match": match,
            "summary": f"prefill logits differ from the 1-rank run by {diff:.3g} (atol {atol:g})",
        }
    eos = run.ctx.eos_ids if run.ctx is not None else []
    match = match_rate(ref, got, count_tokens(ref, eos), count_tokens(got, eos))
    rate = match.get("rate")
    return {
        "compared": "greedy decode tokens vs the 1-rank run",
        "ok": rate == 1.0,
        "token_match": match,
        "summary": f"decode tokens match the 1-rank run at {rate}",
    }


if __name__ == "__main__":
    raise SystemExit(_launcher_main(sys.argv[1]))
