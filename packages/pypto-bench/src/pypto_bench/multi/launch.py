"""``--nproc N`` with ``--placement tensor``: the launching process, the launcher and the
watchdog.

Why this shape:

* Launch is torch's own elastic launcher (``elastic_launch`` / ``LaunchConfig``, what
  ``torchrun`` runs), rendezvous ``c10d`` on 127.0.0.1 with a free port. The launcher runs
  in a child process (``python -m pypto_bench.multi SPEC``) that leads its own process
  group, so a failed or hung run is ended by killing that group: no rank outlives the run
  (the agent alone cannot end a rank that hangs while alive).
* The model loads sharded by transformers (``from_pretrained(distributed_config=
  DistributedConfig(tp_plan="auto"))``: the family's ``base_model_tp_plan``) or, for an
  in-repo family, by its own ``pypto_tp_plan`` (:mod:`pypto_bench.multi.tensor`). A family
  without a plan is refused before launching (:mod:`pypto_bench.multi.preflight`).
* Each rank (:mod:`pypto_bench.multi.rank`) runs the single-process protocol on its shard;
  rank 0 first runs the whole model alone: the 1-rank baseline of the scaling efficiency
  and the reference the sharded outputs are compared against.
* Progress is a per-rank heartbeat file; the launching process ends the run when no rank
  has made progress for ``rank_timeout`` seconds, naming the rank that hangs.
* Nothing outlives the command (:mod:`pypto_bench.multi.lifecycle`): the launcher and the
  ranks each end with their parent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
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
from pypto_common.parent import set_parent_death_signal, watch_parent

from ..errors import BadInputError, RankFailedError
from .lifecycle import (
    EXIT_ORPHANED,
    ORPHAN_SIGNAL,
    cpu_seconds,
    end_group_members,
    live_group_members,
    proc_state,
    sigterm_as_interrupt,
)
from .preflight import BACKEND_FOR, check_before_launch, visible_devices
from .rank import LAUNCHER_PID_ENV, rank_main

if TYPE_CHECKING:
    from ..config import BenchConfig
    from ..report import Report

__all__ = [
    "LAUNCHER_MODULE",
    "ORPHAN_GRACE_S",
    "config_to_json",
    "free_port",
    "launcher_main",
    "node_figures_path",
    "report_from_dict",
    "report_from_folder",
    "run_distributed",
    "run_node",
    "write_node_figures",
]

log = logging.getLogger(__name__)

#: What the launching process runs as ``python -m`` (its ``__main__`` calls
#: :func:`launcher_main` with the spec's path).
LAUNCHER_MODULE = "pypto_bench.multi"
#: Seconds the launcher's watching thread waits for its main thread to clean up after the
#: parent died, before cleaning up itself (a main thread blocked in C never runs handlers).
ORPHAN_GRACE_S = 3.0
#: Seconds between two looks of the launching process at the launcher and the heartbeats.
_POLL_S = 0.2


def free_port() -> int:
    """A free TCP port on loopback for the c10d rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the launching process ---------------------------------------------------------------


def run_distributed(
    config: BenchConfig,
    *,
    progress: Callable[[str, int, int], None] | None = None,
    state_dir: str | Path | None = None,
    validated: bool = False,
) -> Report:
    """Run ``config`` on ``config.nproc`` ranks on this host (see :func:`run_node`, which
    also runs one node of a multi-node run); the report holds every rank's figures."""
    if config.nnodes != 1:
        raise BadInputError(
            f"--nnodes {config.nnodes}: a node without rank 0 has no report; run it through "
            "`pypto-bench run` (pypto_bench.multi.run_node in the library)"
        )
    report = run_node(config, progress=progress, state_dir=state_dir, validated=validated)
    assert report is not None  # one node holds every rank, rank 0 included
    return report


def run_node(
    config: BenchConfig,
    *,
    progress: Callable[[str, int, int], None] | None = None,
    state_dir: str | Path | None = None,
    validated: bool = False,
) -> Report | None:
    """Run this node's ``config.nproc`` ranks (``--nnodes N``: one node of N, met at
    ``--rdzv-endpoint``); the node holding rank 0 returns the report with every rank's
    figures, the others None.

    ``state_dir`` keeps the run's files (per-rank heartbeats with pids, ``result.json``,
    ``outputs.pt`` with rank 0's single-process and sharded outputs, ``launcher.log``);
    default: a temporary folder removed afterwards. ``validated``: the caller has run
    ``config.validate()`` on this very config (``run_bench`` does); otherwise it runs here,
    once. Raises like ``run_bench``, plus ``TooManyRanksError`` (before launching),
    ``NoTensorParallelPlanError`` and ``RankFailedError`` (a rank failed or hung; every rank
    has been ended). ``progress`` is accepted for ``run_bench``'s signature; ranks report
    through their heartbeats.

    No process of the run outlives the caller (see :mod:`pypto_bench.multi.lifecycle`):
    SIGTERM in the main thread unwinds like Ctrl-C (``Terminated``: every rank ended, the
    temporary folder removed); a caller killed outright is noticed by the launcher, which
    ends every rank and removes the temporary folder before exiting.
    """
    if not validated:
        config.validate()
    checked = check_before_launch(config)
    network = None
    if config.nnodes > 1:  # this node's interfaces for the backend, before anything starts
        from ..config import parse_endpoint
        from .network import check_network

        assert config.rdzv_endpoint is not None  # validated
        network = check_network(
            BACKEND_FOR[checked.device_type], *parse_endpoint(config.rdzv_endpoint)
        )
    with sigterm_as_interrupt(), contextlib.ExitStack() as stack:
        temporary = state_dir is None
        if state_dir is None:
            state_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="pypto-dist-"))
        folder = Path(state_dir)
        folder.mkdir(parents=True, exist_ok=True)
        cores = visible_devices("cpu")
        nodes = config.nnodes > 1
        spec = {
            "config": config_to_json(config),
            "device_type": checked.device_type,
            "backend": BACKEND_FOR[checked.device_type],
            "port": free_port(),
            "run_id": (config.rdzv_id or "pypto-bench") if nodes else uuid.uuid4().hex[:12],
            "state_dir": str(folder),
            "threads": max(1, cores // config.nproc),
            "plan": checked.plan,
            "command_line": list(config.command_line or sys.argv),
            # The launcher ends the run when this process ends, removing a temporary folder.
            "parent_pid": os.getpid(),
            "remove_when_orphaned": temporary,
        }
        if nodes:
            from .peers import comm_environment, peer_identity

            assert config.rdzv_endpoint is not None  # validated
            spec.update(
                {
                    "nnodes": config.nnodes,
                    "node_rank": config.node_rank,
                    "rdzv_endpoint": config.rdzv_endpoint,
                    "identity": peer_identity(config),
                    "comm_env": comm_environment(),
                    "network": network,
                    "launcher": (
                        f"torch.distributed.launcher.api.elastic_launch on {config.nnodes} "
                        f"nodes x {config.nproc} ranks (c10d rendezvous at "
                        f"{config.rdzv_endpoint}, id {spec['run_id']})"
                    ),
                }
            )
        spec_path = folder / "spec.json"
        atomic_write_text(spec_path, json.dumps(spec))
        log.info(
            "launching %d ranks (%s, %s, rendezvous %s)",
            config.nproc,
            checked.device_type,
            spec["backend"],
            config.rdzv_endpoint if nodes else f"127.0.0.1:{spec['port']}",
        )
        _launch_and_wait(spec_path, folder, config)
        if not (folder / "result.json").is_file():
            # A node of a multi-node run whose ranks ran, rank 0 elsewhere.
            log.info("this node's ranks are done; the node holding rank 0 writes the report")
            if config.report_file:
                write_node_figures(folder, config)
            return None
        return report_from_folder(folder, config)


def node_figures_path(report_file: str | Path, node_rank: int | None) -> Path:
    """Where a node that did not run rank 0 keeps its own ranks' figures, beside the
    report path it was given: ``r.json`` -> ``r.node1.json`` (``--node-rank 1``), or
    ``r.node-<host>.json`` when no node rank was given."""
    import socket

    path = Path(report_file).expanduser()
    tag = f"node{node_rank}" if node_rank is not None else f"node-{socket.gethostname()}"
    return path.with_name(f"{path.stem}.{tag}{path.suffix or '.json'}")


def write_node_figures(folder: Path, config: BenchConfig) -> Path | None:
    """This node's ranks' own figures (each rank's step times, communication, memory),
    written beside ``--report-file`` on a node whose rank 0 ran elsewhere: the report with
    every rank's figures is that node's; these are what this node measured. None (logged)
    when it cannot be written: the run itself succeeded."""
    import socket

    assert config.report_file is not None
    ranks = []
    for path in sorted(folder.glob("rank*.figures.json")):
        rank = path.name[len("rank") : -len(".figures.json")]
        if rank.isascii() and rank.isdigit():
            ranks.append({"rank": int(rank), "arms": json.loads(path.read_text())})
    doc = {
        "kind": "pypto-bench node figures",
        "nnodes": config.nnodes,
        "node_rank": config.node_rank,
        "host": socket.gethostname(),
        "report": "written on the node that ran rank 0 (every rank's figures, aggregated)",
        "ranks": sorted(ranks, key=lambda r: r["rank"]),
    }
    out = node_figures_path(config.report_file, config.node_rank)
    try:
        atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    except OSError as err:
        log.warning("could not write this node's ranks' figures to %s: %s", out, err)
        return None
    log.info("this node's ranks' figures: %s", out)
    return out


def report_from_folder(folder: Path, config: BenchConfig) -> Report:
    """Rank 0's report from the run's folder: its warnings logged, written to ``--report``
    when asked (one place for this tool's launcher and the user's)."""
    report = report_from_dict(json.loads((folder / "result.json").read_text()))
    for warning in report.warnings:
        log.warning("%s", warning)
    if config.report_file:
        report.write(config.report_file)
    return report


def config_to_json(config: BenchConfig) -> dict[str, Any]:
    """The config as the spec every rank reads (plain JSON values)."""
    return json.loads(json.dumps(asdict(config)))


def report_from_dict(data: dict[str, Any]) -> Report:
    """A ``Report`` from rank 0's ``result.json`` (unknown keys dropped)."""
    from ..report import ArmResult, Report

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
    while live_group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _launch_and_wait(spec_path: Path, folder: Path, config: BenchConfig) -> None:
    log_path = folder / "launcher.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", LAUNCHER_MODULE, str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killpg ends every rank
        )
        # The launcher leads the process group of every rank: its pid names that group.
        atomic_write_text(folder / "launcher.pid", str(proc.pid))
        watch = _Watchdog(
            folder,
            config.nproc,
            config.rank_timeout,
            config.rdzv_endpoint if config.nnodes > 1 else None,
        )
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
    if proc.returncode == 0 and (
        (folder / "result.json").is_file() or config.nnodes > 1  # rank 0 on another node
    ):
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

    def __init__(
        self, folder: Path, nproc: int, timeout: float, rendezvous: str | None = None
    ) -> None:
        self.folder = folder
        self.nproc = nproc
        self.timeout = timeout
        # One node of --nnodes N: where the nodes meet (no rank here starts until they do).
        self.rendezvous = rendezvous
        self.last_change = time.monotonic()
        self.steps: dict[int, Any] = {}
        self.cpu: dict[int, float] = {}
        self.busy: set[int] = set()

    def read(self) -> dict[int, dict[str, Any]]:
        """This node's ranks' heartbeats, by global rank (a node of a multi-node run holds
        the ranks the rendezvous gave it, not 0..nproc-1)."""
        states = {}
        for path in self.folder.glob("rank*.json"):
            m = re.fullmatch(r"rank(\d+)\.json", path.name)
            if m is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                states[int(m.group(1))] = json.loads(path.read_text())
        return states

    def check(self) -> str | None:
        now = time.monotonic()
        states = self.read()
        for rank, st in states.items():
            if self.steps.get(rank) != st.get("step"):
                self.steps[rank] = st.get("step")
                self.last_change = now
            cpu = cpu_seconds(st.get("pid"))
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
        missing = (
            [r for r in range(self.nproc) if r not in states] if len(states) < self.nproc else []
        )
        stopped = [r for r, st in states.items() if proc_state(st.get("pid")) == "T"]
        steps = {r: int(st.get("step", 0)) for r, st in states.items()}
        behind = [r for r, s in steps.items() if s == min(steps.values())] if steps else []
        if not states and self.rendezvous is not None:
            # Across nodes the rendezvous assigns the ranks: none here means it never
            # completed, and the node to look at is one that did not join.
            return (
                f"no rank of this node started within {self.timeout:g} s: the rendezvous at "
                f"{self.rendezvous} did not complete (a node that never joined, or one started "
                "with another --nnodes, --rdzv-id or --rdzv-endpoint); start every node with "
                "the same flags, each its own --node-rank"
            )
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


def launcher_main(spec_path: str) -> int:
    """The launcher (``python -m pypto_bench.multi SPEC``): run the elastic agent over
    :func:`pypto_bench.multi.rank.rank_main`; on a rank failure write ``failure.json``
    naming it. Returns the process's exit status."""
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
    nnodes = int(spec.get("nnodes", 1))
    endpoint = spec.get("rdzv_endpoint") or f"127.0.0.1:{spec['port']}"
    host = endpoint.rpartition(":")[0].strip("[]")
    loopback = host in ("localhost", "127.0.0.1", "::1")
    launch = LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc,
        run_id=spec["run_id"],
        rdzv_backend="c10d",
        rdzv_endpoint=endpoint,
        rdzv_configs={"timeout": int(max(60, spec["config"]["rank_timeout"]))},
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        # One node (or nodes on one host): loopback; else this host's own name, which the
        # other nodes' ranks connect to.
        local_addr="127.0.0.1" if nnodes == 1 or loopback else None,
        # The agent's per-rank logs stay in the run's folder (removed with it), not in a
        # torchelastic_* folder of its own left in the temporary directory.
        logs_specs=DefaultLogsSpecs(log_dir=str(folder / "elastic")),
    )
    try:
        # ``rank_main`` travels to the spawned ranks pickled by reference (its module's
        # name, pypto_bench.multi.rank, and its own), so each rank imports it from there.
        elastic_launch(launch, rank_main)(spec_path)
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
