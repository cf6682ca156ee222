"""What every rank of a multi-process run checks about the others, and how one rank is
placed: shared by this tool's own launcher (:mod:`.launch`, :mod:`.rank`) and the user's
(:mod:`.external`).

A rank's identity (package versions, the model folder's fingerprint, its host) is
gathered over the process group before anything is measured; a peer that differs from
rank 0 is refused in one line naming it, on every rank.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import re
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BadInputError, RankFailedError

if TYPE_CHECKING:
    from ..config import BenchConfig

__all__ = [
    "COMM_VARIABLES",
    "FINGERPRINT_FILE_LIMIT",
    "Launch",
    "check_peers",
    "comm_environment",
    "peer_identity",
    "unreachable_error",
]


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


#: The variables that choose the interfaces and ports collectives use (gloo, NCCL, HCCL).
COMM_VARIABLES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_IB_DISABLE",
    "HCCL_IF_IP",
    "HCCL_SOCKET_IFNAME",
    "HCCL_IF_BASE_PORT",
    "HCCL_CONNECT_TIMEOUT",
)


def comm_environment() -> dict[str, str | None]:
    """The collectives' network settings as this rank sees them (None: unset, the backend
    picks), for the report: a multi-node number is only comparable with its interfaces."""
    return {k: os.environ.get(k) for k in COMM_VARIABLES}


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
        h.update(name.encode() + b"\0" + _bounded(folder / name))
    with contextlib.suppress(OSError):
        for f in sorted(folder.glob("*.safetensors")):
            # Names and sizes of the folder's own regular files only (lstat: a link is
            # not followed out of the folder; its name alone counts).
            st = f.lstat()
            size = str(st.st_size) if stat.S_ISREG(st.st_mode) else "not a regular file"
            h.update(f.name.encode() + b"\0" + size.encode())
    return {
        "host": socket.gethostname(),
        "versions": {
            "pypto-bench": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "model": h.hexdigest()[:16],
    }


#: Bytes of a small metadata file read for the model fingerprint (config.json, the index).
FINGERPRINT_FILE_LIMIT = 8 << 20


def _bounded(path: Path) -> bytes:
    """A folder file's bytes for the fingerprint: a regular file up to the limit; anything
    else (missing, a FIFO, a link out, oversize) is named instead of read."""
    from pypto_common import UntrustedFileError, read_regular_file

    try:
        return read_regular_file(path, FINGERPRINT_FILE_LIMIT)
    except (OSError, UntrustedFileError) as err:
        return f"<unreadable: {type(err).__name__}>".encode()


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


def unreachable_error(launch: Launch, err: BaseException, timeout_s: float) -> RankFailedError:
    """The one line for a rendezvous this rank could not complete in time."""
    from pypto_common import redact

    text = " ".join(str(err).split())
    m = re.search(r"(\d+)/(\d+) clients joined", text)
    if m is not None:
        return RankFailedError(
            f"rank {launch.rank} (world size {launch.world}): only {m.group(1)} of "
            f"{m.group(2)} ranks joined the rendezvous at {launch.master_addr}:"
            f"{launch.master_port} within {timeout_s:g} s: the ranks were started with "
            "different world sizes or one never started; start every rank with the same count"
        )
    return RankFailedError(
        f"rank {launch.rank} could not reach the rendezvous at {launch.master_addr}:"
        f"{launch.master_port} within {timeout_s:g} s ({type(err).__name__}: "
        f"{redact(text)[:120]}): start rank 0 there, set MASTER_ADDR / MASTER_PORT to where "
        f"it listens, and start every rank with the same world size (this one: {launch.world})"
    )
