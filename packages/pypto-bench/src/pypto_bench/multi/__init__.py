"""Multi-device runs: ``--nproc N`` (``--placement tensor``: N ranks, each a shard of every
layer) and ``--placement pipeline`` (one process, the layers split over N devices).

Where each part lives (one trade per module; names shared between them are public, or in
the internal ``_shared``):

* :mod:`.preflight` - checks against the machine and the folder before anything starts
  (too many ranks, no tensor-parallel plan, the folder's own code, accelerate, tokenizer);
  the request's own rules are ``BenchConfig.validate``'s (``config.validate_placement``)
* :mod:`.launch` - the launching process, the launcher (``python -m pypto_bench.multi``),
  the watchdog, the end of a run whose caller is gone; one node of ``--nnodes N``
* :mod:`.external` - one rank of the user's own launcher (torchrun, srun, mpirun)
* :mod:`.peers` - a rank's place, and every rank's check of its peers against rank 0
* :mod:`.lifecycle` - parent-death signal, parent watch, SIGTERM as Ctrl-C, ``/proc``
* :mod:`.rank` - a rank: its entry point, heartbeat, baseline turn and measurement
* :mod:`.arms` - one arm measured with the single-process protocol; the 1-rank baseline
* :mod:`.tensor` - in-repo ``pypto_tp_plan`` sharding and transformers' placement loading
* :mod:`.pipeline` - pipeline placement: stages, device map, the one-process run
* :mod:`.aggregate` - the report from every rank's figures (scaling, agreement, noise)
* :mod:`.comm` - time in collectives (torch.profiler, HCCL trace_view.json)
* :mod:`.fit` - does the whole model fit one device (the baseline's skip rule)
"""

from __future__ import annotations

from ..config import DEFAULT_RANK_TIMEOUT, MAX_RANK_TIMEOUT, validate_placement
from .launch import run_distributed, run_node
from .pipeline import run_pipeline
from .preflight import Preflight, check_before_launch, visible_devices
from .rank import DEVICE_ID_ENV

__all__ = [
    "DEFAULT_RANK_TIMEOUT",
    "DEVICE_ID_ENV",
    "MAX_RANK_TIMEOUT",
    "Preflight",
    "check_before_launch",
    "run_distributed",
    "run_node",
    "run_pipeline",
    "validate_distributed",
    "visible_devices",
]

#: The rules of ``--nproc`` / ``--placement`` / ``--rank-timeout`` / ``--no-baseline``:
#: ``BenchConfig.validate`` runs them (once); their one home is ``pypto_bench.config``.
validate_distributed = validate_placement
