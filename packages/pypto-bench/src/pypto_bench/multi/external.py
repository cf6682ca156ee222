"""Run as one rank of a launcher the user already has: torchrun, Slurm's ``srun``, MPI.

``pypto-bench run`` started by such a launcher (``torchrun --nproc-per-node 2 --no-python
pypto-bench run ...``, an sbatch script's ``srun pypto-bench run ...``, ``mpirun -np 2 -x
MASTER_ADDR -x MASTER_PORT pypto-bench run ...``) finds its rank in the launcher's
environment (:func:`detect_launch`), skips its own launcher, joins the process group and
runs the same rank protocol as an ``--nproc`` run (:mod:`.rank`); rank 0 builds the report.
The processes are the launcher's: it starts them and ends them, and a rank that fails makes
the others fail at their next collective (bounded by the process group's timeout).

Before measuring, every rank checks its peers over the process group (:func:`check_peers`):
the package versions, the model folder's fingerprint, and a loopback rendezvous address
while the ranks run on different hosts are refused in one line naming the rank.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import check_host
from ..errors import BadInputError
from .peers import Launch, comm_environment, peer_identity

if TYPE_CHECKING:
    from ..config import BenchConfig
    from ..report import Report

__all__ = [
    "LAUNCHERS",
    "MAX_WORLD",
    "Launch",
    "detect_launch",
    "first_host",
    "run_launched",
]

log = logging.getLogger(__name__)

#: What each launcher sets (checked in this order).
LAUNCHERS = {
    "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"),
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_NODELIST"),
    "mpirun": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
}
#: The rendezvous port under Slurm when MASTER_PORT is not exported (torch's default).
DEFAULT_PORT = 29500


def _int(env: dict[str, str], name: str, launcher: str) -> int:
    raw = env.get(name, "")
    try:
        value = int(raw)
    except ValueError:
        raise BadInputError(
            f"{launcher} set {name}={raw[:40]!r}, not an integer: start pypto-bench from the "
            "launcher unchanged"
        ) from None
    if value < 0:
        what = "a port" if name.endswith("PORT") else "a rank or rank count"
        raise BadInputError(
            f"{launcher} set {name}={value}: {what} is never negative; start pypto-bench from "
            "the launcher unchanged"
        )
    return value


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``node[03-05,9],gpu1`` -> ``node03``."""
    text = nodelist.strip()
    depth, end = 0, len(text)
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            end = i
            break
    first = text[:end]
    m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", first)
    if m is None:
        if not first or "[" in first or "]" in first:
            raise BadInputError(f"cannot read the Slurm node list {nodelist[:80]!r}")
        return first
    prefix, ranges, suffix = m.groups()
    start = ranges.split(",")[0].split("-")[0]
    return prefix + start + suffix


def detect_launch(env: dict[str, str] | None = None, *, required: bool = False) -> Launch | None:
    """The launch this process is part of, or None (one process, or a 1-process launch).

    ``required`` (``--launched``): no launcher's variables is an error naming them.
    Inconsistent values (a rank outside the world, a missing rendezvous address under
    MPI) raise :class:`BadInputError` in one line.
    """
    env = dict(os.environ if env is None else env)
    found: Launch | None = None
    if all(k in env for k in LAUNCHERS["torchrun"]):
        name = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "env://"
        found = Launch(
            name,
            _int(env, "RANK", name),
            _int(env, "WORLD_SIZE", name),
            _int(env, "LOCAL_RANK", name),
            env["MASTER_ADDR"],
            _int(env, "MASTER_PORT", name),
            "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT",
        )
    elif all(k in env for k in LAUNCHERS["slurm"][:3]):
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or ""
        addr = env.get("MASTER_ADDR") or (first_host(nodes) if nodes else "")
        if not addr:
            raise BadInputError(
                "srun started this rank without SLURM_STEP_NODELIST or MASTER_ADDR: export "
                "MASTER_ADDR=<first node> in the sbatch script"
            )
        port = _int(env, "MASTER_PORT", "slurm") if "MASTER_PORT" in env else DEFAULT_PORT
        found = Launch(
            "srun",
            _int(env, "SLURM_PROCID", "slurm"),
            _int(env, "SLURM_NTASKS", "slurm"),
            _int(env, "SLURM_LOCALID", "slurm"),
            addr,
            port,
            "SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, "
            + ("MASTER_ADDR" if env.get("MASTER_ADDR") else "SLURM_STEP_NODELIST"),
        )
    elif all(k in env for k in LAUNCHERS["mpirun"]):
        world = _int(env, "OMPI_COMM_WORLD_SIZE", "mpirun")
        if world > 1 and not (env.get("MASTER_ADDR") and env.get("MASTER_PORT")):
            raise BadInputError(
                "mpirun started this rank without MASTER_ADDR / MASTER_PORT: pass "
                "-x MASTER_ADDR=<node 0's address> -x MASTER_PORT=<free port> to mpirun"
            )
        found = Launch(
            "mpirun",
            _int(env, "OMPI_COMM_WORLD_RANK", "mpirun"),
            world,
            _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "mpirun"),
            env.get("MASTER_ADDR", "127.0.0.1"),
            _int(env, "MASTER_PORT", "mpirun") if env.get("MASTER_PORT") else DEFAULT_PORT,
            "OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK, MASTER_ADDR",
        )
    if found is None or found.world <= 1:
        if required:
            raise BadInputError(
                "--launched: no launcher started this process (none of RANK/WORLD_SIZE, "
                "SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_RANK/SIZE with more than one "
                "process): start it under torchrun, srun or mpirun, or drop --launched"
            )
        return None
    if found.rank >= found.world or found.local_rank >= found.world:
        raise BadInputError(
            f"{found.launcher} says rank {found.rank} (local {found.local_rank}) of "
            f"{found.world}: a rank must be below the world size"
        )
    _check_endpoint(found)
    return found


#: More ranks than any launcher this tool supports starts (a 10^22 WORLD_SIZE passed).
MAX_WORLD = 1 << 16


def _check_endpoint(found: Launch) -> None:
    """World size, port and host checked before anything waits on them: each used to fail
    later as "could not reach the rendezvous within 20 s" (exit 48) or an unexpected
    UnicodeError (exit 1) though nothing could ever have worked."""
    if found.world > MAX_WORLD:
        raise BadInputError(
            f"{found.launcher} says a world of {found.world} ranks, more than {MAX_WORLD}: "
            "start pypto-bench from the launcher unchanged"
        )
    if not 1 <= found.master_port <= 65535:
        raise BadInputError(
            f"MASTER_PORT={found.master_port} is not a TCP port (1-65535): export the port "
            "rank 0 listens on"
        )
    check_host(found.master_addr, "MASTER_ADDR", "export rank 0's host name or address")


def run_launched(config: BenchConfig, launch: Launch) -> Report | None:
    """Run ``config`` as ``launch``'s rank; rank 0 returns the report (written to
    ``--report`` when asked), the others None. Raises ``BadInputError`` for a request the
    launch contradicts (``--nproc`` other than the world size, pipeline placement) and
    :class:`~pypto_bench.errors.RankFailedError` when the rendezvous is not reached."""

    from ..config import Placement
    from .launch import config_to_json, report_from_folder
    from .network import check_network
    from .preflight import BACKEND_FOR, check_before_launch
    from .rank import Heartbeat, bind_local_device, run_rank

    if config.nproc not in (1, launch.world):
        raise BadInputError(
            f"--nproc {config.nproc} but {launch.launcher} started {launch.world} processes: "
            "drop --nproc (the launcher decides how many ranks run)"
        )
    if config.placement == Placement.PIPELINE:
        raise BadInputError("--placement pipeline runs in one process: start it without a launcher")
    if config.nnodes != 1 or config.rdzv_endpoint is not None:
        raise BadInputError(
            f"{launch.launcher} already placed this process (rank {launch.rank} of "
            f"{launch.world}): drop --nnodes / --rdzv-endpoint, the launcher's own flags set them"
        )
    config = replace(config, nproc=launch.world)
    config.validate()
    # The device from the local rank, before torch or PyPTO initialise it.
    bind_local_device(launch.local_rank, str(config.device))
    # The checks of a launch, against this node: ranks here, not the world.
    local = replace(config, nproc=min(launch.world, launch.local_rank + 1))
    checked = check_before_launch(local)
    network = check_network(
        BACKEND_FOR[checked.device_type], launch.master_addr, launch.master_port
    )
    os.environ.update(
        {
            "RANK": str(launch.rank),
            "WORLD_SIZE": str(launch.world),
            "LOCAL_RANK": str(launch.local_rank),
            "MASTER_ADDR": launch.master_addr,
            "MASTER_PORT": str(launch.master_port),
        }
    )
    if checked.device_type == "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    log.info("%s", launch.describe())
    with tempfile.TemporaryDirectory(prefix="pypto-launched-") as tmp:
        folder = Path(tmp)
        spec = {
            "config": config_to_json(config),
            "device_type": checked.device_type,
            "backend": BACKEND_FOR[checked.device_type],
            "state_dir": str(folder),
            # One core's share per rank on this host: set once the peers are known.
            "threads": 1,
            "plan": checked.plan,
            "command_line": list(config.command_line or sys.argv),
            "launcher": launch.summary(),
            "identity": peer_identity(config),
            "comm_env": comm_environment(),
            "network": network,
        }
        beat = Heartbeat(folder, launch.rank)
        run_rank(spec, launch.rank, beat, launch=launch)
        if launch.rank != 0:
            return None
        return report_from_folder(folder, config)
