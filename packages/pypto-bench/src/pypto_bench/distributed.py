"""Old home of ``--nproc N`` (kept so every existing import keeps working): the code lives
in :mod:`pypto_bench.multi` (one module per trade; see its docstring or the README's "Where
the multi-device code lives"), the request's rules in :mod:`pypto_bench.config`.

``python -m pypto_bench.distributed SPEC`` still starts a launcher (the run itself starts
``python -m pypto_bench.multi SPEC``).
"""

from __future__ import annotations

import sys

from .config import (
    DEFAULT_RANK_TIMEOUT,
    DISTRIBUTED_ARMS,
    DISTRIBUTED_REGIMES,
    MAX_RANK_TIMEOUT,
    check_rank_timeout,
)
from .config import validate_placement as validate_distributed
from .multi.aggregate import LOGITS_ATOL, LOGITS_EPS_FACTOR, NO_BASELINE_FIGURES, add_arm
from .multi.arms import DISTRIBUTED_AUTO_BACKEND
from .multi.comm import COLLECTIVE_PREFIXES, GRAPH_COMM_UNMEASURED_CPU, hccl_spans, union_of_spans
from .multi.fit import (
    BASELINE_HEADROOM,
    baseline_skip_reason,
    checkpoint_bytes,
    fit_reason,
    out_of_memory,
)
from .multi.launch import ORPHAN_GRACE_S, free_port, launcher_main, run_distributed
from .multi.lifecycle import (
    EXIT_ORPHANED,
    GROUP_METHOD,
    ORPHAN_SIGNAL,
    group_jiffies,
    group_load_sampler,
)
from .multi.lifecycle import live_group_members as group_members
from .multi.preflight import (
    BACKEND_FOR,
    check_model_code,
    check_nproc,
    check_tokenizer,
    check_tp_plan,
    require_accelerate,
    visible_devices,
)
from .multi.rank import DEVICE_ID_ENV, LAUNCHER_PID_ENV, RANK_PARENT_POLL_S
from .multi.tensor import PYPTO_PLAN_PREFIX, load_placed

__all__ = [
    "BACKEND_FOR",
    "BASELINE_HEADROOM",
    "COLLECTIVE_PREFIXES",
    "DEFAULT_RANK_TIMEOUT",
    "DEVICE_ID_ENV",
    "DISTRIBUTED_ARMS",
    "DISTRIBUTED_AUTO_BACKEND",
    "DISTRIBUTED_REGIMES",
    "EXIT_ORPHANED",
    "GRAPH_COMM_UNMEASURED_CPU",
    "GROUP_METHOD",
    "LAUNCHER_PID_ENV",
    "LOGITS_ATOL",
    "LOGITS_EPS_FACTOR",
    "MAX_RANK_TIMEOUT",
    "NO_BASELINE_FIGURES",
    "ORPHAN_GRACE_S",
    "ORPHAN_SIGNAL",
    "PYPTO_PLAN_PREFIX",
    "RANK_PARENT_POLL_S",
    "add_arm",
    "baseline_skip_reason",
    "check_model_code",
    "check_nproc",
    "check_rank_timeout",
    "check_tokenizer",
    "check_tp_plan",
    "checkpoint_bytes",
    "fit_reason",
    "free_port",
    "group_jiffies",
    "group_load_sampler",
    "group_members",
    "hccl_spans",
    "load_placed",
    "require_accelerate",
    "run_distributed",
    "validate_distributed",
    "visible_devices",
]

# The old private spellings the tests of this module used (the code calls the public ones).
_union = union_of_spans
_out_of_memory = out_of_memory

if __name__ == "__main__":
    raise SystemExit(launcher_main(sys.argv[1]))
