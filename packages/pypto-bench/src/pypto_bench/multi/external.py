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

import contextlib
import hashlib
import ipaddress
import logging
import os
import re
import socket
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BadInputError, RankFailedError

if TYPE_CHECKING:
    from ..config import BenchConfig
    from ..report import Report

__all__ = [
    "LAUNCHERS",
    "Launch",
    "check_peers",
    "detect_launch",
    "first_host",
    "peer_identity",
    "run_launched",
    "unreachable_error",
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


@dataclass(frozen=True)
class Launch:
    """This process's place in an external launch."""

    launcher: str
    rank: int
    world: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # the variables it was read from

    def summary(self) -> str:
        """What started the ranks, for the report (the same on every rank)."""
        return (
            f"{self.launcher}: {self.world} ranks from its environment ({self.source}), "
            f"process group rendezvous at {self.master_addr}:{self.master_port}"
        )

    def describe(self) -> str:
        return (
            f"rank {self.rank} of {self.world} (local rank {self.local_rank}), started by "
            f"{self.launcher} (from {self.source}), rendezvous {self.master_addr}:{self.master_port}"
        )


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
        raise BadInputError(f"{launcher} set {name}={value}: a rank count is never negative")
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
    return found


def _is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(addr).is_loopback
    return False


def peer_identity(config: BenchConfig) -> dict[str, Any]:
    """What must be the same on every rank: package versions and the model folder's
    fingerprint (its config.json and weight index bytes, the weight files' names and
    sizes), with this rank's host."""
    import torch
    import transformers

    from .. import __version__

    folder = Path(str(config.model_path)).expanduser()
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors.index.json"):
        with contextlib.suppress(OSError):
            h.update(name.encode() + b"\0" + (folder / name).read_bytes()[: 8 << 20])
    with contextlib.suppress(OSError):
        for f in sorted(folder.glob("*.safetensors")):
            h.update(f.name.encode() + b"\0" + str(f.stat().st_size).encode())
    return {
        "host": socket.gethostname(),
        "versions": {
            "pypto-bench": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "model": h.hexdigest()[:16],
    }


def check_peers(mine: dict[str, Any], launch: Launch) -> list[dict[str, Any]]:
    """Every rank's :func:`peer_identity`, gathered; raises the same one-line error on
    every rank when a peer differs from rank 0 (versions, model) or the rendezvous is
    loopback while the ranks are on different hosts."""
    import torch.distributed as dist

    everyone: list[Any] = [None] * launch.world
    dist.all_gather_object(everyone, mine)
    hosts = sorted({str(p["host"]) for p in everyone})
    if len(hosts) > 1 and _is_loopback(launch.master_addr):
        raise BadInputError(
            f"the rendezvous address {launch.master_addr} is loopback but the ranks run on "
            f"{len(hosts)} hosts ({', '.join(hosts[:4])}): set MASTER_ADDR to node 0's address"
        )
    ref = everyone[0]
    for rank, peer in enumerate(everyone[1:], start=1):
        for key in ("versions", "model"):
            if peer[key] != ref[key]:
                what = "package versions" if key == "versions" else "model folder"
                raise BadInputError(
                    f"rank {rank} on {peer['host']} has a different {what} than rank 0 on "
                    f"{ref['host']} ({peer[key]} vs {ref[key]}): install the same versions "
                    "and copy the same model folder to every node"
                )
    return everyone


def run_launched(config: BenchConfig, launch: Launch) -> Report | None:
    """Run ``config`` as ``launch``'s rank; rank 0 returns the report (written to
    ``--report`` when asked), the others None. Raises ``BadInputError`` for a request the
    launch contradicts (``--nproc`` other than the world size, pipeline placement) and
    :class:`~pypto_bench.errors.RankFailedError` when the rendezvous is not reached."""
    import json

    from ..config import Placement
    from .launch import report_from_dict
    from .preflight import BACKEND_FOR, check_before_launch, visible_devices
    from .rank import Heartbeat, run_rank

    if config.nproc not in (1, launch.world):
        raise BadInputError(
            f"--nproc {config.nproc} but {launch.launcher} started {launch.world} processes: "
            "drop --nproc (the launcher decides how many ranks run)"
        )
    if config.placement == Placement.PIPELINE:
        raise BadInputError("--placement pipeline runs in one process: start it without a launcher")
    config = replace(config, nproc=launch.world)
    config.validate()
    # The checks of a launch, against this node: ranks here, not the world.
    local = replace(config, nproc=min(launch.world, launch.local_rank + 1))
    checked = check_before_launch(local)
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
            "config": json.loads(json.dumps(_asdict(config))),
            "device_type": checked.device_type,
            "backend": BACKEND_FOR[checked.device_type],
            "state_dir": str(folder),
            "threads": max(1, visible_devices("cpu") // max(1, _local_ranks(launch))),
            "plan": checked.plan,
            "command_line": list(config.command_line or sys.argv),
            "launcher": launch.summary(),
            "identity": peer_identity(config),
        }
        beat = Heartbeat(folder, launch.rank)
        run_rank(spec, launch.rank, beat, launch=launch)
        if launch.rank != 0:
            return None
        data = json.loads((folder / "result.json").read_text())
    report = report_from_dict(data)
    for warning in report.warnings:
        log.warning("%s", warning)
    if config.report_file:
        report.write(config.report_file)
    return report


def _local_ranks(launch: Launch) -> int:
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        with contextlib.suppress(ValueError):
            return max(1, int(os.environ.get(name, "").split("(")[0]))
    return launch.world


def _asdict(config: BenchConfig) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(config)


def unreachable_error(launch: Launch, err: BaseException, timeout_s: float) -> RankFailedError:
    """The one line for a rendezvous this rank could not reach in time."""
    return RankFailedError(
        f"rank {launch.rank} could not reach the rendezvous at {launch.master_addr}:"
        f"{launch.master_port} within {timeout_s:g} s ({type(err).__name__}): start rank 0 "
        "there, or set MASTER_ADDR / MASTER_PORT to where it listens"
    )
